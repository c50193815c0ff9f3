"""frost's exception types: every error a user can trigger is one of these."""

from __future__ import annotations


class FrostError(Exception):
    """Base of every error frost raises on purpose."""


class GraphError(FrostError, ValueError):
    """A declaration is wrong: the message names the tensor and what was expected."""


class BindingError(FrostError, ValueError):
    """A tensor bound at execute does not match its declaration."""


class WorkspaceError(FrostError, ValueError):
    """The workspace passed to execute is missing, too small or misaligned."""


class EngineDecline(FrostError, NotImplementedError):
    """One engine cannot serve a graph; `reason` says why in one sentence."""

    def __init__(self, engine: str, reason: str):
        self.engine = engine
        self.reason = reason
        super().__init__(f"{engine}: {reason}")


class NotSupportedError(FrostError, NotImplementedError):
    """No engine can serve the graph; lists every engine with its reason."""

    def __init__(self, what: str, declines: list[tuple[str, str]]):
        self.declines = list(declines)
        lines = [f"no engine can serve {what}:"]
        lines += [f"  - {name}: {reason}" for name, reason in self.declines]
        super().__init__("\n".join(lines))


class GraphNotSupportedError(GraphError, NotSupportedError):
    """A declaration cuDNN's validate() also refuses as not supported (its GRAPH_NOT_SUPPORTED, e.g. ALiBi without a
    causal band): a GraphError that cuDNN code catches as cudnnGraphNotSupportedError."""

    def __init__(self, message: str):
        self.declines = []
        Exception.__init__(self, message)


class TemplateParamsError(FrostError, ValueError):
    """A kernel template's validator rejected its parameters (a capability row lied)."""


class PlanFileError(GraphError):
    """A saved plan file cannot be read, or was saved for a graph with other facts."""


class PlanFileWarning(UserWarning):
    """A saved plan loaded, but some of its kernels compile here (another frost build or arch, an unusable artifact)."""


class UnsupportedArgumentError(FrostError, NotImplementedError):
    """A torch-face call passed an argument value frost does not serve (dropout, ALiBi, softcap, ...)."""


class PlanDuringCaptureError(FrostError, RuntimeError):
    """A torch-face call needed a new plan while its stream was capturing a CUDA graph (warm up first)."""


#: cuDNN's name for "no engine can serve this graph" (raised by validate, check_support and build_plans; cuDNN's
#: own validate-time refusals are GraphNotSupportedError, a kind of it)
cudnnGraphNotSupportedError = NotSupportedError
