"""Passive-viewing recordings (:mod:`~stimsim.lab.recordings.base`), read by format plug-ins
(:mod:`~stimsim.lab.recordings.formats`: NetCDF, NWB)."""
from stimsim.lab.recordings.base import FIELD_NAMES, POSITION_TOLERANCE_MM, Recordings, load_recordings
from stimsim.lab.recordings.formats import (RECORDING_FORMATS, RecordingFormat, RecordingTable, format_of,
                                            register_recording_format)

__all__ = ["FIELD_NAMES", "POSITION_TOLERANCE_MM", "RECORDING_FORMATS", "RecordingFormat", "RecordingTable",
           "Recordings", "format_of", "load_recordings", "register_recording_format"]
