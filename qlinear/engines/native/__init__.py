"""The native engine's operator glue: each module turns an operator's prepared constants into
the layouts its C kernels take and runs them (qlinear._native holds the loading, the ISA
level and the threads)."""
