"""Traces of the collectives: Chrome trace files per rank, merged on one timeline, and hang verdicts."""

__all__ = ["TRACER", "Tracer", "flush", "trace"]

from .recorder import TRACER, Tracer, flush, trace
