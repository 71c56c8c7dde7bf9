"""The capture cache: a decode step captured once as a CUDA graph per (bucket, with the
sampler or not, host buffer pair) and replayed for every later step of that shape. Where
capture fails, steps run eagerly: the same kernels, the same results."""

from __future__ import annotations

import inspect
import warnings
import weakref


def buckets_for(max_batch_size: int) -> list[int]:
    """Decode batch sizes with a graph of their own: 1, 2, 4, ..., the first power of two
    >= max_batch_size (a step runs in the smallest that holds its rows). Buckets at 3 x 2^k
    too were measured and gave nothing (docs/KERNELS.md, ninth session)."""
    out = [1]
    while out[-1] < max_batch_size:
        out.append(out[-1] * 2)
    return out


class DecodeGraphs:
    """Graphs of `body(bucket, sample, buffer_pair)` (the step's kernels, launched on `stream`).
    A bound method is held weakly: the backend that owns this cache and whose method it is
    then goes (KV cache, weights, graphs) with its last reference, not at the cycle
    collector's next full pass (an ablation makes engines of several GiB, run after run)."""

    def __init__(self, stream, body, enabled: bool = True):
        self.stream = stream
        self._body = weakref.WeakMethod(body) if inspect.ismethod(body) else (lambda: body)
        self.enabled = enabled
        self.graphs: dict[tuple[int, bool, int], object] = {}
        self.error: str | None = None  # why capture failed, once it has

    def body(self, b: int, sample: bool, k: int) -> None:
        self._body()(b, sample, k)

    def __contains__(self, key: tuple[int, bool, int]) -> bool:
        return key in self.graphs

    def get(self, b: int, sample: bool, k: int):
        """The captured step of bucket b on host buffer pair k, captured now if it is not yet;
        None when capture is off or failed."""
        key = (b, sample, k)
        graph = self.graphs.get(key)
        if graph is None and self.enabled:
            with self.stream:
                self.body(b, sample, k)  # warm-up outside the capture: cuBLAS picks its kernels
                self.stream.synchronize()
                self.stream.begin_capture()
                try:
                    self.body(b, sample, k)
                except Exception as e:
                    try:
                        self.stream.end_capture()
                    except Exception:
                        pass
                    self.enabled = False
                    self.error = f"{type(e).__name__}: {e}"
                    warnings.warn(f"cuda backend: CUDA graph capture failed ({self.error}); "
                                  "decoding without graphs", RuntimeWarning)
                    return None
                graph = self.stream.end_capture()
            self.graphs[key] = graph
        return graph

    def run(self, b: int, sample: bool, k: int) -> bool:
        """The step of bucket b on buffer pair k: its graph, or eagerly; True for the graph.
        Call inside `with stream:`."""
        graph = self.get(b, sample, k) if self.enabled else None
        if graph is not None:
            graph.launch(self.stream)
        else:
            self.body(b, sample, k)
        return graph is not None
