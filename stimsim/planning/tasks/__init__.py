"""The tasks ``stimsim plan`` rehearses, one module each: the 2AFC sequences of Mehrer et al. 2025
(:mod:`~stimsim.planning.tasks.sequence_2afc`, the default) and the face / non-face task of Afraz et al. 2006
(:mod:`~stimsim.planning.tasks.face_categorization`); the interface is :mod:`~stimsim.planning.tasks.base`."""
from stimsim.planning.tasks.base import PLAN_TASKS, PlanTask, get_plan_task, register_plan_task, stimulation_at

__all__ = ["PLAN_TASKS", "PlanTask", "get_plan_task", "register_plan_task", "stimulation_at"]
