"""stimsim: model-guided cortical microstimulation simulator."""
__version__ = "0.1.0"
