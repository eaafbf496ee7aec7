"""lazygrad's AMD package: the `CL` device (OpenCL through pyopencl, on any OpenCL platform, PoCL included), the `AMD`
device (an AMD GPU on AMD's OpenCL platform), and the `HIP` device (AMDGPU code objects that LLVM builds, run through
libamdhip64), with the renderers they use and the WMMA/MFMA tensor-core descriptions. `lazygrad_amd.plugin` registers
them.

The classes are imported on first use, so that loading the plugin stays cheap and a missing OpenCL or HIP runtime
shows up as "device not usable" rather than as a plugin that fails to import."""

from __future__ import annotations

from lazygrad_uop.lazy_exports import lazy_exports

__version__ = "0.5.1"

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "OpenCLRenderer": "lazygrad_amd.opencl_renderer",
        "CLDevice": "lazygrad_amd.opencl",
        "CLAllocator": "lazygrad_amd.opencl",
        "CLCompiler": "lazygrad_amd.opencl",
        "CLProgram": "lazygrad_amd.opencl",
        "cl_devices": "lazygrad_amd.opencl",
        "AMDGPURenderer": "lazygrad_amd.amdgpu_renderer",
        "AMDGPUCompiler": "lazygrad_amd.amdgpu_compiler",
        "find_ld_lld": "lazygrad_amd.amdgpu_compiler",
        "HIPDevice": "lazygrad_amd.hip",
        "HIPAllocator": "lazygrad_amd.hip",
        "HIPProgram": "lazygrad_amd.hip",
    },
)
