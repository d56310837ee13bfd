"""Analytic FLOPs and bytes of framework operators, from their recorded input shapes and dtypes.

Used where hardware counters are absent, and always labelled "analytic". FLOPs follow PyTorch's FLOP counter
(``torch.utils.flop_counter``): a multiply-add is 2 FLOPs; matrix products 2*M*N*K; convolutions
2 * batch * prod(weight shape) * prod(output spatial dims), and their backward a forward's for each gradient it
computes (input, weight); scaled dot-product attention two batched products. Element-wise and normalisation
ops, which that counter ignores, count FLOPs per output element (1, or 5 for softmax and norms, and their
backward as many) so that memory-bound work is visible, and reductions and pools one per element read.
Recurrent layers (LSTM, GRU, RNN and their cells), which that counter does not count either, count the products
of their weight matrices: 2 FLOPs per weight element per token (time step and batch row) and direction, 4 in
their backward; the gates' element-wise work is left out. Bytes are the minimum traffic: every tensor input read
once and the output written once (output shape inferred per op). Ops with no formula get no cost (unknown),
never zero.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

_MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"}
_CONV = {"aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution"}
_SDPA = {
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
}
_ELEMENTWISE = {
    f"aten::{n}{suffix}"
    for n in (
        "add",
        "sub",
        "mul",
        "div",
        "relu",
        "gelu",
        "silu",
        "sigmoid",
        "tanh",
        "neg",
        "exp",
        "pow",
        "rsqrt",
        "sqrt",
        "clamp",
        "hardtanh",
        "leaky_relu",
        "where",
        "threshold",
        "dropout",
        "masked_fill",
        "maximum",
        "minimum",
    )
    for suffix in ("", "_")
}
_ELEMENTWISE_BACKWARD = {
    f"aten::{n}_backward" for n in ("threshold", "gelu", "sigmoid", "tanh", "silu", "hardtanh", "leaky_relu")
}
"""The backward of element-wise activations: ``(grad_output, self or output, ...)``, one FLOP per element as
their forward."""
_FIVE_PER_ELEMENT = {
    "aten::softmax",
    "aten::_softmax",
    "aten::log_softmax",
    "aten::_log_softmax",
    "aten::layer_norm",
    "aten::native_layer_norm",
    "aten::batch_norm",
    "aten::native_batch_norm",
    "aten::_batch_norm_impl_index",
    "aten::group_norm",
    "aten::native_group_norm",
    "aten::native_layer_norm_backward",
    "aten::native_batch_norm_backward",
    "aten::native_group_norm_backward",
    "aten::_softmax_backward_data",
    "aten::_log_softmax_backward_data",
}
_REDUCE = {"aten::sum", "aten::mean", "aten::amax", "aten::amin"}
_REDUCE_ALL = {"aten::sum", "aten::mean"}
"""Reductions with an overload over every element, ``(self, *, dtype)``: ``x.sum()``, ``x.mean()``; its two
inputs tell it from the overloads over dims (``sum.dim_IntList``: self, dims, keepdim, dtype)."""
_REDUCE_DIM = {"aten::max", "aten::min", "aten::argmax", "aten::argmin", "aten::prod"}
"""Reductions over every element or over one dim given as an integer: ``x.max()`` (self alone), ``x.prod()``
(self, dtype), ``x.argmax()`` (self, dim None, keepdim); ``x.max(dim=1)``, ``argmax(x, 1)``, ``prod(x, 1)`` (self,
dim, keepdim...). ``max(self, other)`` and ``min(self, other)`` are elementwise (``_binary_max``)."""
_ADAPTIVE_POOL = {f"aten::adaptive_{kind}_pool{nd}d" for kind in ("avg", "max") for nd in (1, 2, 3)}
_POOL = {f"aten::{kind}_pool{nd}d" for kind in ("max", "avg") for nd in (1, 2, 3)} | {
    f"aten::max_pool{nd}d_with_indices" for nd in (2, 3)
}
"""Windowed pools: ``(self, kernel_size, stride, padding, dilation, ceil_mode)`` for a max pool,
``(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)`` for an average one; a
stride of ``[]`` is the kernel's. One compare or add per element of each window."""
_COPY = {"aten::copy_", "aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone", "aten::cat"}
_GATHER = {"aten::embedding", "aten::index_select"}
_RNN = {"aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu"}
"""Whole recurrent modules: ``(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
batch_first)``, or ``(data, batch_sizes, hx, ...)`` for a packed sequence; ``params`` (a tensor list, recorded as
a list of shapes) holds every layer's and direction's weights and biases, ``hx`` the initial states (a list of two
for an LSTM)."""
_RNN_CELL = {"aten::lstm_cell", "aten::gru_cell", "aten::rnn_tanh_cell", "aten::rnn_relu_cell"}
"""One time step: ``(input, hx, w_ih, w_hh, b_ih, b_hh)``."""
_RNN_LAYER = {"aten::mkldnn_rnn_layer": 2, "aten::mkldnn_rnn_layer_backward": 4}
"""One layer of a CPU LSTM (oneDNN), ``(input, w_ih, w_hh, ...)``, and its backward (the input and weight
gradients: twice the forward's products), by multiply-adds per weight element and token."""

COSTED_OPS: frozenset[str] = frozenset(
    _MATMUL
    | _CONV
    | _SDPA
    | _ELEMENTWISE
    | _ELEMENTWISE_BACKWARD
    | _FIVE_PER_ELEMENT
    | _REDUCE
    | _REDUCE_DIM
    | _ADAPTIVE_POOL
    | _POOL
    | _COPY
    | _GATHER
    | {"aten::convolution_backward"}
    | _RNN
    | _RNN_CELL
    | set(_RNN_LAYER)
)
"""Op names with a formula. The shallowest such op on a call path is costed; its nested ops are not again."""

NO_ARITHMETIC: frozenset[str] = frozenset(
    f"aten::{n}"
    for n in (
        "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
        "fill_", "zero_", "arange", "detach", "detach_", "alias", "lift_fresh", "view", "_unsafe_view", "reshape",
        "_reshape_alias", "as_strided", "expand", "expand_as", "t", "transpose", "permute", "unsqueeze", "squeeze",
        "flatten", "unflatten", "select", "slice", "narrow", "split", "split_with_sizes", "chunk", "unbind", "resize_",
        "set_", "item", "_local_scalar_dense", "is_nonzero", "result_type", "broadcast_tensors", "resolve_conj",
        "resolve_neg", "requires_grad_", "cat", "stack", "randn", "rand", "randint", "randperm", "uniform_", "normal_",
        "bernoulli_", "random_",
    )
)  # fmt: skip
"""Ops with no formula (or none that a trace's shapes serve: ``aten::cat``'s tensors are a list, of no
recorded dtype) that do no arithmetic worth a FLOP: allocation, views and metadata, copies, fills, random
numbers. Their time says nothing of the work that an op without a formula did (``_kernels_layer``)."""

_DTYPE_BYTES = {
    "double": 8,
    "float": 4,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "long int": 8,
    "long": 8,
    "int": 4,
    "short": 2,
    "bool": 1,
    "unsigned char": 1,
    "signed char": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
}
_PRECISION = {
    "double": "fp64",
    "float": "fp32",
    "c10::Half": "fp16",
    "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
}


@dataclass(frozen=True)
class OpCost:
    """Analytic cost of one op call: FLOPs (None when the op has no FLOP formula), bytes read and written,
    precision of its floating-point inputs (``fp32``, ``bf16``, ...)."""

    flops: int | None
    read_bytes: int
    write_bytes: int
    precision: str | None


def op_cost(name: str, shapes: Any, dtypes: Any, concrete: Any = None, flops: Any = None) -> OpCost | None:
    """The analytic cost of one op from its input ``shapes`` (list of lists), ``dtypes`` (list of strings) and
    ``concrete`` inputs (strings such as ``"[1, 1]"``); ``flops`` is the profiler's own count when recorded."""
    if not isinstance(shapes, list):
        return None
    dts = dtypes if isinstance(dtypes, list) else []
    tensors = [(s, _DTYPE_BYTES.get(str(d), 0)) for s, d in zip(shapes, dts, strict=False) if _is_shape(s) and s]
    if not tensors:
        return None
    precision = next((_PRECISION[str(d)] for d in dts if str(d) in _PRECISION), None)
    # the output takes the first floating-point input's dtype (indices and masks do not decide it)
    item = next((_DTYPE_BYTES[str(d)] for d in dts if str(d) in _PRECISION), tensors[0][1]) or 4
    read = sum(_numel(s) * b for s, b in tensors)
    out = _output_numel(name, shapes, concrete if isinstance(concrete, list) else [])
    if out is None:
        return None
    if name in _GATHER:  # only the indexed rows of the table are read, not all of it
        read = sum(_numel(s) * b for s, b in tensors[1:]) + out * item
    if name in _RNN:  # the weights and initial states, recorded as lists of shapes, are read too
        read += sum(_numel(t) for s in shapes if _is_shape_list(s) for t in s) * item
    counted = _flops(name, shapes, concrete if isinstance(concrete, list) else [], out)
    if isinstance(flops, (int, float)) and flops > 0:
        counted = int(flops)
    return OpCost(counted, read, out * item, precision)


def _is_shape(s: Any) -> bool:
    return isinstance(s, list) and all(isinstance(d, int) for d in s)


def _is_shape_list(s: Any) -> bool:
    """A tensor list's shapes, as the profiler records them: ``[[4, 8], [8]]``."""
    return isinstance(s, list) and bool(s) and all(_is_shape(t) and t for t in s)


def _numel(shape: list[int]) -> int:
    return int(math.prod(shape)) if shape else 1


def _output_numel(name: str, shapes: list[Any], concrete: list[Any]) -> int | None:
    dims = [s for s in shapes if _is_shape(s)]
    if name in _MATMUL:
        mnk = _matmul_dims(name, shapes)
        return None if mnk is None else mnk[0] * mnk[1] * mnk[3]
    if name in _WINDOWED:
        windowed = _windowed(name, shapes, concrete)
        return None if windowed is None else windowed[0]
    if name in _SDPA:
        q, v = shapes[0], shapes[2] if len(shapes) > 2 else None
        if not (_is_shape(q) and _is_shape(v) and q and v):
            return None
        return _numel(q[:-1]) * int(v[-1])
    if _binary_max(name, shapes):  # elementwise, broadcast
        return max(_numel(s) for s in shapes[:2])
    if name in _REDUCE or name in _REDUCE_DIM or name in _ADAPTIVE_POOL:
        return _reduced_numel(name, shapes, concrete)
    if name in _RNN or name in _RNN_CELL or name in _RNN_LAYER:
        rnn = _rnn_dims(name, shapes, concrete)
        return None if rnn is None else rnn[2]
    if name in _GATHER:
        weight, index = (shapes[0], shapes[1]) if name == "aten::embedding" else (shapes[0], shapes[2])
        if not (_is_shape(weight) and _is_shape(index) and len(weight) >= 2):
            return None
        return _numel(index) * _numel(weight[1:])
    return max((_numel(s) for s in dims if s), default=None)


def _flops(name: str, shapes: list[Any], concrete: list[Any], out: int) -> int | None:
    if name in _MATMUL:
        mnk = _matmul_dims(name, shapes)
        return None if mnk is None else 2 * mnk[0] * mnk[1] * mnk[2] * mnk[3]
    if name in _WINDOWED:
        windowed = _windowed(name, shapes, concrete)
        return None if windowed is None else windowed[1]
    if name in _SDPA:
        q, k, v = shapes[0], shapes[1], shapes[2]
        if not all(_is_shape(t) and len(t) >= 2 for t in (q, k, v)):
            return None
        batch = _numel(q[:-2])
        return int(2 * batch * q[-2] * k[-2] * (q[-1] + v[-1]))
    if name in _RNN or name in _RNN_CELL or name in _RNN_LAYER:
        rnn = _rnn_dims(name, shapes, concrete)
        return None if rnn is None else _RNN_LAYER.get(name, 2) * rnn[0] * rnn[1]
    if name in _ELEMENTWISE or name in _ELEMENTWISE_BACKWARD or _binary_max(name, shapes):
        return out
    if name in _FIVE_PER_ELEMENT:
        return 5 * out
    if name in _REDUCE or name in _REDUCE_DIM or name in _ADAPTIVE_POOL:  # one add (or compare) per element read
        return _numel(shapes[0])
    if name in _COPY or name in _GATHER:  # they move bytes only: an embedding's lookup is no arithmetic
        return 0
    return None


def _reduced_numel(name: str, shapes: list[Any], concrete: list[Any]) -> int | None:
    """Output elements of a reduction over the dims in its second input (``[]``: all of them) or of an adaptive
    pool to the output size there; None where the input or that argument was not recorded."""
    x = shapes[0] if shapes else None
    if not _is_shape(x) or not x:
        return None
    text = str(concrete[1]).strip() if len(concrete) > 1 else ""
    values = [int(v) for v in re.findall(r"-?\d+", text)]
    if name in _ADAPTIVE_POOL:
        nd = int(name[-2])
        values = values * nd if len(values) == 1 else values
        if len(values) != nd or len(x) <= nd:
            return None
        return _numel(x[:-nd]) * _numel(values)
    if name in _REDUCE_DIM:
        if re.fullmatch(r"-?\d+", text):  # one dim
            d = int(text)
            return _numel([n for i, n in enumerate(x) if i != d % len(x)]) if -len(x) <= d < len(x) else None
        every = len(shapes) == 1 or (name == "aten::prod" and len(shapes) == 2)  # x.max(), x.prod(dtype)
        every = every or (name in ("aten::argmax", "aten::argmin") and text in ("", "None"))  # dim=None
        return 1 if every else None
    if not text.startswith("["):  # not a list of dims: the overload over every element, or dims not recorded
        return 1 if name in _REDUCE_ALL and len(shapes) == 2 else None
    if text == "[]":
        return 1
    if not values or any(not -len(x) <= d < len(x) for d in values):
        return None
    reduced = {d % len(x) for d in values}
    return _numel([n for i, n in enumerate(x) if i not in reduced])


def _rnn_dims(name: str, shapes: list[Any], concrete: list[Any]) -> tuple[int, int, int] | None:
    """(tokens, weight elements, output elements) of a recurrent op: the time steps times batch rows of its input
    (a packed sequence's rows), the elements of the weight matrices each token goes through (every layer and
    direction: a layer's input and hidden weights, and its projection), and what it writes (the last layer's
    outputs per token and direction, and the final states); None where the weights were not recorded."""
    x = shapes[0] if shapes else None
    if not _is_shape(x) or not x:
        return None
    tokens = _numel(x[:-1])
    if name in _RNN:
        lists = [i for i, s in enumerate(shapes) if _is_shape_list(s) and any(len(t) == 2 for t in s)]
        if not lists or lists[-1] < 2:
            return None
        p = lists[-1]  # params come after the initial states, which an LSTM also passes as a list
        hx = shapes[p - 1]
        states = hx if _is_shape_list(hx) else [hx] if _is_shape(hx) and hx else []
        if not states:
            return None
        both = len(concrete) > p + 5 and str(concrete[p + 5]).strip() == "True"  # bidirectional
        out = tokens * (2 if both else 1) * states[0][-1] + sum(_numel(t) for t in states)
        return tokens, sum(_numel(t) for t in shapes[p] if len(t) == 2), out
    first = 2 if name in _RNN_CELL else 1  # a cell's hidden state comes before its weights
    w_ih: Any = shapes[first] if len(shapes) > first else None
    w_hh: Any = shapes[first + 1] if len(shapes) > first + 1 else None
    if not (_is_shape(w_ih) and _is_shape(w_hh) and len(w_ih) == 2 and len(w_hh) == 2):
        return None
    hidden = w_hh[1]
    if name in _RNN_CELL:  # the new hidden state (and, for an LSTM, the new cell state)
        return tokens, _numel(w_ih) + _numel(w_hh), tokens * hidden * (2 if name == "aten::lstm_cell" else 1)
    if name == "aten::mkldnn_rnn_layer_backward":  # the input's and the weights' gradients
        return tokens, _numel(w_ih) + _numel(w_hh), tokens * x[-1] + _numel(w_ih) + _numel(w_hh)
    return tokens, _numel(w_ih) + _numel(w_hh), tokens * hidden  # the layer's output per token


def _binary_max(name: str, shapes: list[Any]) -> bool:
    """``max(self, other)`` / ``min(self, other)``: two tensors, compared element by element."""
    return name in ("aten::max", "aten::min") and len(shapes) == 2 and all(_is_shape(s) and s for s in shapes)


def _matmul_dims(name: str, shapes: list[Any]) -> tuple[int, int, int, int] | None:
    """(batch, M, K, N) of a matrix product from its input shapes."""
    if name in ("aten::addmm", "aten::baddbmm"):
        shapes = shapes[1:]
    if len(shapes) < 2 or not (_is_shape(shapes[0]) and _is_shape(shapes[1])):
        return None
    a, b = shapes[0], shapes[1]
    if name == "aten::linear":  # input [..., K] (one vector: [K]), weight [N, K]
        return (1, _numel(a[:-1]), a[-1], b[0]) if a and len(b) == 2 else None
    if len(a) < 2 or len(b) < 1:
        return None
    if len(b) < 2:
        return None
    return max(_numel(a[:-2]), _numel(b[:-2])), a[-2], a[-1], b[-1]


def _conv_dims(name: str, shapes: list[Any], concrete: list[Any]) -> tuple[int, int] | None:
    """(output elements, FLOPs) of a convolution: input [N, C, *spatial], weight [Cout, Cin/groups, *kernel]
    (a transposed one's, ``aten::convolution`` with ``transposed``: [Cin, Cout/groups, *kernel], its FLOPs over
    the input's positions, as PyTorch's counter has them); padding ``"same"`` keeps the input's size and
    ``"valid"`` is none."""
    x: list[int] = shapes[0]
    w: list[int] = shapes[1] if len(shapes) > 1 else []
    if not (_is_shape(x) and _is_shape(w)) or len(x) < 3 or len(x) != len(w):
        return None
    nd = len(x) - 2
    stride, padding, dilation = (_int_list(concrete, i, nd, d) for i, d in ((3, 1), (4, 0), (5, 1)))
    if name in ("aten::convolution", "aten::_convolution") and _flag(concrete, 6):  # transposed
        extra = _int_list(concrete, 7, nd, 0)  # output_padding
        groups = (_int_list(concrete, 8, 1, 1) or [1])[0]
        spatial = [
            (size - 1) * st - 2 * p + dil * (k - 1) + e + 1
            for size, k, st, p, dil, e in zip(x[2:], w[2:], stride, padding, dilation, extra, strict=True)
        ]
        if any(d <= 0 for d in spatial):
            return None
        return x[0] * w[1] * groups * _numel(spatial), 2 * x[0] * _numel(w) * _numel(x[2:])
    mode = str(concrete[4]).strip().strip("'\"") if len(concrete) > 4 else ""
    if mode == "same":
        spatial = list(x[2:])
    else:
        padding = [0] * nd if mode == "valid" else padding
        spatial = [
            (size + 2 * p - dil * (k - 1) - 1) // st + 1
            for size, k, st, p, dil in zip(x[2:], w[2:], stride, padding, dilation, strict=True)
        ]
    if any(d <= 0 for d in spatial):
        return None
    out = x[0] * w[0] * _numel(spatial)
    return out, 2 * x[0] * _numel(w) * _numel(spatial)


def _conv_backward(shapes: list[Any], concrete: list[Any]) -> tuple[int, int] | None:
    """(output elements, FLOPs) of ``aten::convolution_backward(grad_output, input, weight, bias_sizes, stride,
    padding, dilation, transposed, output_padding, groups, output_mask)``: the input's gradient and the weight's
    (as ``output_mask`` asks) cost a forward's FLOPs each, as in PyTorch's counter; they are written, and the
    bias's."""
    if len(shapes) < 3 or len(concrete) < 11:
        return None
    g, x, w = shapes[0], shapes[1], shapes[2]
    if not all(_is_shape(t) and t for t in (g, x, w)):
        return None
    mask = [v.lower() == "true" for v in re.findall(r"[A-Za-z]+", str(concrete[10]))]
    if len(mask) < 2:
        return None
    over = x[2:] if _flag(concrete, 7) else g[2:]  # a transposed convolution's positions are its input's
    forward = 2 * x[0] * _numel(w) * _numel(over)
    bias = g[1] if len(mask) > 2 and mask[2] else 0
    return mask[0] * _numel(x) + mask[1] * _numel(w) + bias, forward * (mask[0] + mask[1])


_WINDOWED = _CONV | {"aten::convolution_backward"} | _POOL
"""Ops whose output size and FLOPs come from a window slid over the input (``_windowed``)."""


def _windowed(name: str, shapes: list[Any], concrete: list[Any]) -> tuple[int, int] | None:
    """(output elements, FLOPs) of a convolution, its backward or a pool (``_WINDOWED``)."""
    if name in _CONV:
        return _conv_dims(name, shapes, concrete)
    if name == "aten::convolution_backward":
        return _conv_backward(shapes, concrete)
    return _pool_dims(name, shapes, concrete)


def _pool_dims(name: str, shapes: list[Any], concrete: list[Any]) -> tuple[int, int] | None:
    """(output elements, FLOPs) of a windowed pool (``_POOL``): the output's positions as PyTorch sizes them
    (``ceil_mode`` included, a window starting in the right padding dropped), each window's elements compared or
    added once; None where the input or the kernel size was not recorded."""
    nd = int(name.split("_pool")[1][0])
    x: Any = shapes[0] if shapes else None
    if not _is_shape(x) or len(x) <= nd:
        return None
    kernel = _int_list(concrete, 1, nd, 0)
    if not all(kernel):
        return None
    given = _int_list(concrete, 2, nd, 0)
    stride = given if all(given) else kernel
    padding = _int_list(concrete, 3, nd, 0)
    average = name.startswith("aten::avg_")
    dilation = [1] * nd if average else _int_list(concrete, 4, nd, 1)
    ceil = _flag(concrete, 4 if average else 5)
    out = []
    for size, k, st, p, dil in zip(x[-nd:], kernel, stride, padding, dilation, strict=True):
        span = size + 2 * p - dil * (k - 1) - 1
        n = (-(-span // st) if ceil else span // st) + 1
        if ceil and (n - 1) * st >= size + p:
            n -= 1
        if n <= 0:
            return None
        out.append(n)
    positions = _numel(x[:-nd]) * _numel(out)
    return positions, positions * _numel(kernel)


def _flag(concrete: list[Any], index: int) -> bool:
    """Whether the concrete input at ``index`` is ``True``."""
    return len(concrete) > index and str(concrete[index]).strip() == "True"


def _int_list(concrete: list[Any], index: int, n: int, default: int) -> list[int]:
    text = str(concrete[index]) if index < len(concrete) else ""
    values = [int(v) for v in re.findall(r"-?\d+", text)]
    if len(values) == 1:
        values = values * n
    return values if len(values) == n else [default] * n
