"""Electrode arrays: layouts (Utah grids, CSV, Blackrock .cmp), poses on a sheet, anatomical frames."""
from stimsim.lab.arrays.anatomy import AnatomicalPose
from stimsim.lab.arrays.layout import UTAH_PITCH_MM, ArrayLayout, load_layout, utah_array
from stimsim.lab.arrays.pose import ArrayPose, angle_difference_deg, pose_error

__all__ = ["AnatomicalPose", "ArrayLayout", "ArrayPose", "UTAH_PITCH_MM", "angle_difference_deg", "load_layout",
           "pose_error", "utah_array"]
