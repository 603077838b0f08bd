"""Fused linear + cross-entropy against ``F.cross_entropy(F.linear(...))`` in float64, both backends."""

import pytest
import torch
import torch.nn.functional as F
from kernel_testing import DEVICES
from test_call_path import _OpLog

from brickwork.errors import ConfigError
from brickwork.kernels import fused_linear_cross_entropy
from brickwork.kernels import linear_cross_entropy as lce
from brickwork.kernels.fused.cross_entropy import cross_entropy_chunk_forward
from brickwork.kernels.linear_cross_entropy import addmm_accumulates_in_float32, default_chunk_size
from brickwork.kernels.reference import cross_entropy_chunk_ref

BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.filterwarnings("ignore::RuntimeWarning"))]


def _problem(n, d, v, device, dtype=torch.float32, bias=True, ignore_index=-100):
    hidden = torch.randn(n, d, device=device).to(dtype).requires_grad_()
    weight = (torch.randn(v, d, device=device) / d**0.5).to(dtype).requires_grad_()
    b = torch.randn(v, device=device).to(dtype).requires_grad_() if bias else None
    labels = torch.randint(0, v, (n,), device=device)
    labels[::4] = ignore_index
    return hidden, weight, b, labels


def _reference(hidden, weight, bias, labels, ignore_index=-100, reduction="mean"):
    """The unfused loss and its gradients, in float64 on the CPU."""
    args = [
        t.detach().cpu().double().requires_grad_()
        for t in (hidden, weight) + (() if bias is None else (bias,))
    ]
    logits = F.linear(args[0], args[1], args[2] if bias is not None else None)
    loss = F.cross_entropy(logits, labels.cpu(), ignore_index=ignore_index, reduction=reduction)
    return loss, torch.autograd.grad(loss, args)


def _check(loss, grads, ref_loss, ref_grads, tol):
    torch.testing.assert_close(loss.double(), ref_loss, rtol=tol, atol=tol)
    for grad, ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(grad.double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize(("n", "chunk_size"), [(37, 8), (37, None), (5, 64)])
def test_matches_the_unfused_loss_in_float64(backend, reduction, n, chunk_size):
    # 37 tokens in chunks of 8 leave a partial last chunk; V = 53 is no power of two.
    hidden, weight, bias, labels = _problem(n, 16, 53, "cpu")
    loss = fused_linear_cross_entropy(
        hidden, weight, labels, bias, reduction=reduction, chunk_size=chunk_size, backend=backend
    )
    grads = torch.autograd.grad(loss * 3.0, (hidden, weight, bias))
    ref_loss, ref_grads = _reference(hidden, weight, bias, labels, reduction=reduction)
    _check(loss, grads, ref_loss, [3.0 * g for g in ref_grads], 2e-5 if reduction == "mean" else 1e-4)


def test_the_torch_path_is_exact_in_float64():
    hidden, weight, bias, labels = _problem(37, 16, 53, "cpu", torch.float64)
    loss = fused_linear_cross_entropy(hidden, weight, labels, bias, reduction="sum", chunk_size=8)
    grads = torch.autograd.grad(loss, (hidden, weight, bias))
    ref_loss, ref_grads = _reference(hidden, weight, bias, labels, reduction="sum")
    _check(loss, grads, ref_loss, ref_grads, 1e-12)


@pytest.mark.parametrize(
    ("dtype", "chunk_size", "chunked"),
    [
        (torch.float32, None, False),
        (torch.float64, 16, False),
        (torch.float32, 8, True),
        (torch.bfloat16, None, True),
    ],
)
def test_the_torch_path_chunks_only_where_chunking_saves_memory(dtype, chunk_size, chunked):
    # One chunk holding all 16 tokens holds the whole logits anyway: float32/float64 ones go through
    # torch's own cross-entropy. Several chunks, or bf16 logits (whose weight gradient the chunked
    # function accumulates in float32), take the chunked function.
    hidden, weight, bias, labels = _problem(16, 8, 30, "cpu", dtype)
    loss = fused_linear_cross_entropy(
        hidden, weight, labels, bias, reduction="sum", chunk_size=chunk_size, backend="torch"
    )
    assert ("FusedLinearCrossEntropy" in type(loss.grad_fn).__name__) == chunked
    grads = torch.autograd.grad(loss, (hidden, weight, bias))
    ref_loss, ref_grads = _reference(hidden, weight, bias, labels, reduction="sum")
    _check(loss, grads, ref_loss, ref_grads, {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 5e-2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_triton_rows_wider_than_a_block_and_another_ignore_index(device):
    # V = 4500 > 4096 columns per step: both passes over a row loop.
    hidden, weight, bias, labels = _problem(6, 8, 4500, device, ignore_index=7)
    loss = fused_linear_cross_entropy(hidden, weight, labels, bias, ignore_index=7, backend="triton")
    grads = torch.autograd.grad(loss, (hidden, weight, bias))
    ref_loss, ref_grads = _reference(hidden, weight, bias, labels, ignore_index=7)
    _check(loss.cpu(), [g.cpu() for g in grads], ref_loss, ref_grads, 1e-5)


def _loss_and_grads(hidden, weight, bias, labels, backend, reduction):
    loss = fused_linear_cross_entropy(
        hidden, weight, labels, bias, reduction=reduction, chunk_size=8, backend=backend
    )
    inputs = (hidden, weight) + (() if bias is None else (bias,))
    return loss, torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("bias", [True, False])
def test_a_padded_vocabulary_gives_the_loss_and_gradients_of_the_unpadded_one(
    monkeypatch, backend, reduction, bias
):
    # CUDA pads V = 53 to 64 (pads_vocabulary); forced here on the CPU. Row 4 is ignored and holds
    # inf: its hidden gradient is 0 either way, though F.linear gives its padding columns NaN.
    hidden, weight, b, labels = _problem(37, 16, 53, "cpu", bias=bias)
    with torch.no_grad():
        hidden[4] = float("inf")
    assert not lce.pads_vocabulary(weight)
    unpadded = _loss_and_grads(hidden, weight, b, labels, backend, reduction)
    monkeypatch.setattr(lce, "pads_vocabulary", lambda weight: True)
    padded = _loss_and_grads(hidden, weight, b, labels, backend, reduction)
    torch.testing.assert_close(padded[0], unpadded[0], rtol=1e-6, atol=1e-6)
    for got, expected in zip(padded[1], unpadded[1], strict=True):
        assert got.shape == expected.shape
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert (padded[1][0][4] == 0).all() and padded[1][0][5:].isfinite().all()


def _with_padding_rows(weight, bias, rows):
    """``weight`` [V, D] and ``bias`` [V] with padding rows up to ``rows`` whose logits (3 per unit of
    hidden, plus a bias of 50) would swamp any softmax they took part in."""
    pad, like = rows - weight.shape[0], {"dtype": weight.dtype, "device": weight.device}
    padded = torch.cat([weight.detach(), torch.full((pad, weight.shape[1]), 3.0, **like)])
    if bias is None:
        return padded.requires_grad_(), None
    return padded.requires_grad_(), torch.cat(
        [bias.detach(), torch.full((pad,), 50.0, **like)]
    ).requires_grad_()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize(("chunk_size", "aligned"), [(8, False), (None, False), (8, True)])
def test_vocab_size_scores_the_real_rows_only(monkeypatch, device, backend, reduction, chunk_size, aligned):
    # A model's own padding (vocab_multiple): V = 53 real rows of 60. chunk_size None takes torch's own
    # cross entropy on the torch path; ``aligned`` adds the CUDA alignment padding (to 64) on top.
    hidden, weight, bias, labels = _problem(37, 16, 53, device)
    padded_weight, padded_bias = _with_padding_rows(weight, bias, 60)
    monkeypatch.setattr(lce, "pads_vocabulary", lambda weight: aligned)
    loss = fused_linear_cross_entropy(
        hidden, padded_weight, labels, padded_bias, reduction=reduction, chunk_size=chunk_size,
        backend=backend, vocab_size=53,
    )  # fmt: skip
    grads = [g.cpu() for g in torch.autograd.grad(loss, (hidden, padded_weight, padded_bias))]
    assert not grads[1][53:].any() and not grads[2][53:].any()  # the padding rows get no gradient
    ref_loss, ref_grads = _reference(hidden, weight, bias, labels, reduction=reduction)
    _check(
        loss.cpu(),
        [grads[0], grads[1][:53], grads[2][:53]],
        ref_loss,
        ref_grads,
        2e-5 if reduction == "mean" else 1e-4,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_compiled_path_scores_the_real_rows_only_too(dtype):
    hidden, weight, bias, labels = _problem(37, 16, 53, "cpu", dtype)
    padded_weight, padded_bias = _with_padding_rows(weight, bias, 60)
    inputs = (hidden, padded_weight, padded_bias)
    plain = lce.checkpointed_chunks(hidden, padded_weight, labels, padded_bias, -100, "sum", 8, 53)
    grads = torch.autograd.grad(plain, inputs)
    assert not grads[1][53:].any() and not grads[2][53:].any()
    ref_loss, ref_grads = _reference(hidden, weight, bias, labels, reduction="sum")
    _check(
        plain,
        [grads[0], grads[1][:53], grads[2][:53]],
        ref_loss,
        ref_grads,
        1e-4 if dtype == torch.float32 else 1e-10,
    )


def test_the_cpu_never_pads():
    assert not lce.pads_vocabulary(torch.empty(53, 4))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_pads_an_odd_bfloat16_vocabulary_to_the_same_loss_and_gradients(monkeypatch, backend):
    # 1000 = 15 x 64 + 40: padded to 1024. The weight gradient accumulates through addmm's out_dtype
    # where this build has it, padded or not.
    hidden, weight, bias, labels = _problem(300, 64, 1000, "cuda", torch.bfloat16)
    assert lce.pads_vocabulary(weight) and not lce.pads_vocabulary(weight[:960])
    padded = _loss_and_grads(hidden, weight, bias, labels, backend, "mean")
    monkeypatch.setattr(lce, "pads_vocabulary", lambda weight: False)
    unpadded = _loss_and_grads(hidden, weight, bias, labels, backend, "mean")
    # Other cuBLAS kernels may round a bf16 logit the other way; a padding column in the softmax
    # would add far more.
    torch.testing.assert_close(padded[0], unpadded[0], rtol=1e-3, atol=1e-4)
    for got, expected in zip(padded[1], unpadded[1], strict=True):
        torch.testing.assert_close(got, expected, rtol=2e-2, atol=1e-4)
    ref_loss, ref_grads = _reference(hidden, weight, bias, labels)
    _check(padded[0].cpu(), [g.cpu() for g in padded[1]], ref_loss, ref_grads, 2e-2)


def test_the_float32_accumulating_matmul_is_a_feature_check():
    # addmm's out_dtype overload has no CPU kernel: the check says so instead of raising.
    assert addmm_accumulates_in_float32(torch.device("cpu"), torch.bfloat16) is False


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_weights_match_the_unfused_head(backend):
    # The unfused head computes bf16 logits and upcasts them; the fused loss rounds the same logits.
    hidden, weight, _, labels = _problem(24, 32, 70, "cpu", torch.bfloat16, bias=False)
    loss = fused_linear_cross_entropy(hidden, weight, labels, chunk_size=8, backend=backend)
    grads = torch.autograd.grad(loss, (hidden, weight))
    assert loss.dtype == torch.float32 and [g.dtype for g in grads] == [torch.bfloat16] * 2
    unfused = F.cross_entropy(F.linear(hidden, weight).float(), labels)
    torch.testing.assert_close(loss, unfused, rtol=1e-5, atol=1e-5)
    ref_loss, ref_grads = _reference(hidden, weight, None, labels)
    _check(loss, grads, ref_loss, ref_grads, 2e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_leading_dims_and_frozen_parameters(backend):
    hidden, weight, _, labels = _problem(12, 8, 30, "cpu", bias=False)
    weight.requires_grad_(False)
    loss = fused_linear_cross_entropy(hidden.view(3, 4, 8), weight, labels.view(3, 4), backend=backend)
    (grad,) = torch.autograd.grad(loss, hidden)
    ref_loss, (ref_grad, _) = _reference(hidden, weight, None, labels)
    _check(loss, [grad], ref_loss, [ref_grad], 1e-5)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_chunk_kernel_matches_its_twin():
    logits = torch.randn(9, 300) * 4
    logits[2, 17] = float("nan")
    labels = torch.randint(0, 300, (9,))
    labels[4] = -100
    for compute_grad in (False, True):
        ours, twins = logits.clone(), logits.clone()
        losses = cross_entropy_chunk_forward(ours, labels, -100, compute_grad, ours.shape[1])
        expected = cross_entropy_chunk_ref(twins, labels, -100, compute_grad, twins.shape[1])
        torch.testing.assert_close(losses, expected, equal_nan=True)
        torch.testing.assert_close(ours, twins, equal_nan=True)
    assert losses[2].isnan() and ours[2].isnan().all() and losses[4] == 0 and (ours[4] == 0).all()


def test_eager_launches_directly_and_compiling_checkpoints_plain_chunks(monkeypatch):
    hidden, weight, bias, labels = _problem(10, 8, 20, "cpu")
    with _OpLog() as log:
        eager = fused_linear_cross_entropy(hidden, weight, labels, bias, chunk_size=4, backend="triton")
    assert not [op for op in log.names if op.startswith("brickwork.")]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with _OpLog() as log:
        traced = fused_linear_cross_entropy(hidden, weight, labels, bias, chunk_size=4, backend="triton")
    assert not [op for op in log.names if op.startswith("brickwork.")]
    assert log.names.count("aten.nll_loss_forward.default") == 3  # one plain loss per chunk of 4
    torch.testing.assert_close(traced, eager)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_checkpointed_chunks_give_the_fused_loss_and_gradients(dtype, reduction):
    hidden, weight, bias, labels = _problem(37, 16, 53, "cpu", dtype)
    inputs = (hidden, weight, bias)
    fused = lce.linear_cross_entropy(hidden, weight, labels, bias, -100, reduction, 8)
    plain = lce.checkpointed_chunks(hidden, weight, labels, bias, -100, reduction, 8)
    torch.testing.assert_close(plain, fused)
    for a, b in zip(torch.autograd.grad(plain, inputs), torch.autograd.grad(fused, inputs), strict=True):
        torch.testing.assert_close(a, b)


def test_decoder_lm_exposes_hidden_states_and_head_weight():
    from brickwork.factory import build_model, get_preset

    torch.manual_seed(0)
    model = build_model(get_preset("gpt-tiny")).eval()
    ids = torch.randint(0, model.vocab_size, (2, 9))
    labels = ids[:, 1:]
    hidden = model.hidden_states(ids)[:, :-1]
    fused = fused_linear_cross_entropy(hidden, model.head_weight, labels, reduction="sum")
    unfused = F.cross_entropy(model(ids)[:, :-1].flatten(0, 1), labels.flatten(), reduction="sum")
    torch.testing.assert_close(fused, unfused, rtol=1e-5, atol=1e-4)


def test_default_chunk_holds_at_most_256_mib_of_float32_logits():
    assert default_chunk_size(8192, 50257) == 1024  # 1024 x 50257 x 4 bytes = 196 MiB
    assert default_chunk_size(8192, 32000) == 2048
    assert default_chunk_size(100, 50257) == 128  # never more than the tokens, rounded up
    assert default_chunk_size(1, 2**30) == 1


def test_bad_inputs_raise_clear_errors():
    hidden, weight, bias, labels = _problem(4, 8, 10, "cpu")
    with pytest.raises(ConfigError, match=r"reduction.*allowed: mean, sum"):
        fused_linear_cross_entropy(hidden, weight, labels, reduction="none")
    with pytest.raises(ConfigError, match=r"chunk_size must be a positive int"):
        fused_linear_cross_entropy(hidden, weight, labels, chunk_size=0)
    with pytest.raises(ValueError, match=r"must agree on D"):
        fused_linear_cross_entropy(hidden, weight[:, :7], labels)
    with pytest.raises(TypeError, match=r"weight has dtype torch.float64"):
        fused_linear_cross_entropy(hidden, weight.double(), labels)
    with pytest.raises(TypeError, match=r"labels must be an int64 or int32 tensor of shape \(4,\)"):
        fused_linear_cross_entropy(hidden, weight, labels.float())
    with pytest.raises(ValueError, match=r"label 10 is outside \[0, 10\)"):
        fused_linear_cross_entropy(hidden, weight, torch.tensor([0, 10, -100, 2]))
    with pytest.raises(ValueError, match=r"bias must have shape \(10,\)"):
        fused_linear_cross_entropy(hidden, weight, labels, bias[:5])
    for vocab_size in (0, 11, 1.5, True):
        with pytest.raises(ConfigError, match=r"vocab_size: vocab_size must be an int in \[1, 10\]"):
            fused_linear_cross_entropy(hidden, weight, labels, vocab_size=vocab_size)
    with pytest.raises(ValueError, match=r"label 8 is outside \[0, 8\)"):  # a padding row is no class
        fused_linear_cross_entropy(hidden, weight, torch.tensor([0, 8, -100, 2]), vocab_size=8)


def _compiles_in_one_graph(device, backend):
    hidden, weight, bias, labels = _problem(40, 16, 50, device)

    def loss(hidden, weight, bias, labels):
        return fused_linear_cross_entropy(
            hidden, weight, labels, bias, reduction="sum", chunk_size=16, backend=backend
        )

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    got, expected = compiled(hidden, weight, bias, labels), loss(hidden, weight, bias, labels)
    torch.testing.assert_close(got, expected)
    for a, b in zip(
        torch.autograd.grad(got, (hidden, weight, bias)),
        torch.autograd.grad(expected, (hidden, weight, bias)),
        strict=True,
    ):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("padded", [False, True])
def test_the_torch_path_compiles_in_one_graph(monkeypatch, padded):
    monkeypatch.setattr(lce, "pads_vocabulary", lambda weight: padded)
    _compiles_in_one_graph("cpu", "torch")


@pytest.mark.gpu
def test_the_triton_path_compiles_in_one_graph_on_cuda():
    # The eager side pads V = 50 on CUDA; the compiled side checkpoints plain chunks.
    _compiles_in_one_graph("cuda", "triton")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_chunk_kernel_gives_an_out_of_range_label_a_nan_loss_without_reading_out_of_bounds():
    # On a GPU the entry point does not check label values (that would synchronise): the kernel must
    # neither read past the row nor hide the error.
    logits = torch.randn(3, 40)
    labels = torch.tensor([5, 40, -7])
    losses = cross_entropy_chunk_forward(logits, labels, -100, True, logits.shape[1])
    assert losses[0].isfinite() and losses[1:].isnan().all()
    assert logits[0].isfinite().all() and logits[1:].isnan().all()
