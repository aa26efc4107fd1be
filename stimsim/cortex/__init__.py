"""The model cortex: sheets of units placed in mm (:mod:`~stimsim.cortex.sheet`), their initial positions
(:mod:`~stimsim.cortex.positions`) and the topography of a property over a sheet (:mod:`~stimsim.cortex.topography`)."""
