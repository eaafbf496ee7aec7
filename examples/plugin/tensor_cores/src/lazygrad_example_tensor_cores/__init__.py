"""An example tensor-core-only lazygrad plugin: one description for CUDA sm_86."""
