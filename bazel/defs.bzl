"""tff_dp_test: one py_test per test file, run by pytest (bazel/pytest_main.py)."""

def tff_dp_test(name, src, timeout = "eternal", deps = [], **kwargs):
    """A py_test that runs pytest on `src` with the project's interpreter.

    Args:
      name: Target name.
      src: The test file (pytest style).
      timeout: Bazel timeout class ("eternal": 3600 s; two test files share
        the 2 cores, and the slowest file took 567 s alone on a slow day).
      deps: Libraries beyond tff_dp, aggregators and tasks (benchmarks).
      **kwargs: Passed to py_test.
    """
    native.py_test(
        name = name,
        srcs = ["//bazel:pytest_main.py", src],
        main = "//bazel:pytest_main.py",
        args = ["$(location %s)" % src],
        data = ["//tests:conftest", "//:pyproject"],
        deps = ["//tff_dp", "//aggregators", "//tasks"] + deps,
        python_version = "PY3",
        timeout = timeout,
        **kwargs
    )
