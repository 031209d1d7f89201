"""The Python tests, one folder per subpackage of torch_offload (or per concern: apply, distributed,
packaging, docs, examples, models, suite); shared fixtures in conftest.py, shared helpers and the
scripts run in subprocesses in support/. Test modules import as python_tests.<folder>.test_<name>,
so two folders may hold files of the same name."""
