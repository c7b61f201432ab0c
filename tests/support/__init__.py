"""What several test files share: paths, skip reasons, real servers, fakes of remote models, env builders.

Test files import from here and never from one another, so a test file can move, be renamed or be
deleted without breaking another; `tests/project/test_test_imports.py` holds that rule.
"""
