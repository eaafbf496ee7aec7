"""lazygrad's METAL device: will hold the Metal Shading Language renderer, the runtime through the Objective-C
runtime on macOS and the simdgroup-matrix tensor-core descriptions. `plugin` registers the `METAL` device."""
