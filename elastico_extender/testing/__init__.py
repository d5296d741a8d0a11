"""Support for tests and benchmarks that exercise the service from outside (no mocks)."""
