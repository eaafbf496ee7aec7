"""The conformance suite: `pytest --pyargs lazygrad_testkit --lazygrad-device=NAME` runs these tests on a device."""
