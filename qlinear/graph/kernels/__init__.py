"""The graph runtime's OpRun kernels: ``standard`` (the six operators, BatchNormalization,
MaxPool), ``float`` (float glue operators), ``contrib`` (com.microsoft), ``nbits``
(com.microsoft MatMulNBits, GatherBlockQuantized), ``control`` (Loop,
Scan), ``sizeguard`` (the size limit's guards)."""
