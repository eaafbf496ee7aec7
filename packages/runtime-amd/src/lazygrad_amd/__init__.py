"""lazygrad's AMD device: will hold the OpenCL renderer and runtime through pyopencl (any OpenCL platform,
PoCL included), AMDGPU code objects through LLVM and the WMMA tensor-core descriptions. `plugin` registers the
`AMD` device."""
