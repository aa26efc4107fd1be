"""The lab side: electrode arrays and their poses (:mod:`~stimsim.lab.arrays`), passive-viewing recordings
(:mod:`~stimsim.lab.recordings`) and behavioural sessions (:mod:`~stimsim.lab.sessions`), each file format read by
one module behind a registry. Nothing here needs a network."""
