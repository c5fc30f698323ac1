"""The graph runtime's OpRun kernels: ``standard`` (the six operators, BatchNormalization,
MaxPool), ``float`` (float glue operators), ``contrib`` (com.microsoft), ``control`` (Loop,
Scan), ``sizeguard`` (the size limit's guards)."""
