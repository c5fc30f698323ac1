"""The ``qlinear`` commands, one module each (``run``, ``compare``, ``inspect``, ``conformance``),
with what they share (``common``: no onnx; ``inputs``: the model and inputs of run and
compare). ``qlinear.cli`` parses the command line and imports a command's module when it
runs: the commands need onnx (the tools extra), the parser does not."""
