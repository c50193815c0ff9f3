"""A stand-in for looseversion where it is not installed: the cuDNN frontend's tests compare version strings
with it. Copied as looseversion.py beside those tests by the cudnn_frontend_*.sh scripts."""


class LooseVersion:
    """Dotted version strings compared by their numeric parts (all the tests ask of it)."""

    def __init__(self, text):
        self.parts = tuple(int(p) for p in str(text).split(".") if p.isdigit())

    def _other(self, other):
        return other.parts if isinstance(other, LooseVersion) else LooseVersion(other).parts

    def __lt__(self, other):
        return self.parts < self._other(other)

    def __le__(self, other):
        return self.parts <= self._other(other)

    def __gt__(self, other):
        return self.parts > self._other(other)

    def __ge__(self, other):
        return self.parts >= self._other(other)

    def __eq__(self, other):
        return self.parts == self._other(other)
