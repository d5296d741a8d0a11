"""ElastiCo."""
