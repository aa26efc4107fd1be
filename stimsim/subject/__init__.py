"""Virtual subjects: a topographic model with an implanted array, recorded and (see the behaviour
modules) performing tasks under stimulation."""
from stimsim.subject.virtual import VirtualSubject, random_pose

__all__ = ["VirtualSubject", "random_pose"]
