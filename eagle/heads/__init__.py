"""Draft heads and their files: the EAGLE-1/2 and EAGLE-3 modules, checkpoints and serving layouts,
the draft vocabulary, and which target layers a head reads."""
