"""stimsim: model-guided cortical microstimulation simulator."""
from stimsim.utilities.moved import install as _install_moved_modules

__version__ = "0.1.0"
_install_moved_modules()
