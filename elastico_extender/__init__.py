"""ElastiCo: a Kubernetes scheduler extender for safe GPU co-location of DL jobs.

Layout: ``core`` is the pure scheduling engine (RST shapes, ESP pricing, IAC
interference, PDS planner); the service, the simulator and the CLI drive it.
"""

__version__ = "0.1.0"
