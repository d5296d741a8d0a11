"""The cluster view: Kubernetes list/watch + bind, or the embedded file-backed cluster."""
