"""lazygrad-testkit: the conformance suite every lazygrad device plugin runs, and the test support it is made of.

- `op_suite`: Tensor graphs across ops and dtypes, each with its numpy reference, run on any device;
- `kernel_graphs`: the kinds of kernels the op suite produces, to compile without running;
- `graph_contract`: the checks every device's graph type (`GraphRunner`) must pass;
- `kernel_ast`: builders of kernel ASTs (`lazygrad_codegen.kernel_ast`);
- `dtypes`: the dtype lists the suite draws from;
- `registry`: isolated registries and stand-in devices, through the registry's public interface;
- `conformance`: the suite itself, `pytest --pyargs lazygrad_testkit --lazygrad-device=NAME`.

The modules import what they need when imported; `import lazygrad_testkit` alone loads nothing else.
"""
