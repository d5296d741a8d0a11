"""The extender service: engine (epoch loop + per-pod answers), settings, metrics, CLI."""
