"""cases.py: the case counter every oracle and reference script prints through: one line per case
(`ok   NAME: INFO` or `FAIL NAME: ERROR; ERROR [INFO]`, an exception being that case's failure)
and the closing `N passed, M failed`. No numpy or torch needed (harness.py re-exports it for
the torch scripts; qwen35_reference_check.py uses it without torch). Exercised by every script
that uses it.
"""
import sys


class Cases:
    """Counts the cases and prints one line for each."""

    def __init__(self):
        self.passed = self.failed = 0

    def report(self, name, errors, info=""):
        """`ok   NAME: INFO` (`ok   NAME` without info) or `FAIL NAME: ERRORS [INFO]`."""
        if errors:
            self.failed += 1
            print(f"FAIL {name}: " + "; ".join(errors) + (f" [{info}]" if info else ""))
        else:
            self.passed += 1
            print(f"ok   {name}" + (f": {info}" if info else ""))
        sys.stdout.flush()

    def run(self, name, fn, *args):
        """fn(*args) -> (errors, info) as the case `name`; its exception is its failure, not
        the whole run's."""
        try:
            errors, info = fn(*args)
        except Exception as exc:
            errors, info = [f"exception: {exc!r}"], ""
        self.report(name, errors, info)

    def summary(self):
        """Prints the last line, `N passed, M failed`; returns the exit status."""
        print(f"{self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0
