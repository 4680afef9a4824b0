"""PyTorch → ONNX: one encoder graph and one step decoder graph per export (and, asked for with
``multi_step``, a k-position step for speculative greedy), validated hard.

A template method in the CTranslate2 spirit: refuse a bad destination, build the generic
wrappers, export, check (onnx checker + shape inference + ONNX Runtime against PyTorch),
write the manifest, and only then move the folder into place.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import shutil
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from s2s_deploy.architecture.registry import REGISTRY
from s2s_deploy.errors import S2SError
from s2s_deploy.format.files import sha256_of, staged_directory
from s2s_deploy.format.manifest import CheckpointEntry, IOEntry, Manifest
from s2s_deploy.format.names import ROLLBACK, TOP_K, TOP_OUTPUTS, init_name, past_name, present_name
from s2s_deploy.format.source import TOKEN_SOURCE, SourceSpec
from s2s_deploy.format.subword import write_files
from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.frontends.source import check_frontend
from s2s_deploy.modeling.contract import ArchitecturePlugin, Seq2SeqModel, StateSpec
from s2s_deploy.modeling.graphs import EncoderGraph, GraphIO, MultiStepGraph, StepGraph, io_names, multi_io_names
from s2s_deploy.modeling.plugin_errors import check_batch_axes, check_encoded, plugin_errors
from s2s_deploy.runtime.ort.backend import quiet_native_output
from s2s_deploy.transforms.share import external_files, load_graph, save_graph, share_weights
from s2s_deploy.verify.checks import check_encoder_axes_torch, check_model_torch, run_export_checks
from s2s_deploy.verify.multi_step import check_multi_step
from s2s_deploy.verify.tolerance import DEFAULT_RTOL, NO_DIFF, StepTolerance, plugin_tolerance

DEFAULT_OPSET = 18
ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
MULTI_FILE = "decoder_multi.onnx"
MULTI_POSITIONS = {"example": 4, "probe": 3}
"""Target positions of the k-position step's example and probe inputs (apart from every other size)."""
CHECKPOINT_FILE = "checkpoint.safetensors"
# Example sizes: distinct and >= 2 so no dynamic axis is specialised or unified with another.
# ``rows``: the decoder's rows where its memory has one row per sentence (``memory_per_sentence``),
# several per sentence, so the two batch axes stay apart; otherwise the rows are the ``batch``.
# Sizes apart from each other and from what a source length becomes (7 frames: 4 positions after a
# stride-2 convolution; the past 5, and 6 once grown), so no two axes share a name or a traced symbol.
_EXAMPLE = {"batch": 3, "src_len": 7, "past_len": 5, "rows": 12}
_PROBE = {"batch": 2, "src_len": 9, "past_len": 6, "rows": 10}


class ExportShapeError(S2SError):
    pass


class ExportToleranceError(S2SError):
    pass


@dataclass(frozen=True)
class ExportReport:
    directory: Path
    exporter: str
    max_abs_diff: dict[str, float]
    graph_bytes: dict[str, int]


@dataclass(frozen=True)
class _Specs:
    memory: tuple
    state: tuple[StateSpec, ...]
    io: GraphIO
    source: SourceSpec = TOKEN_SOURCE
    memory_per_sentence: bool = False

    def rows(self, sizes: dict[str, int]) -> int:
        """The decoder example's rows: several per sentence where its memory is per sentence."""
        return sizes["rows"] if self.memory_per_sentence else sizes["batch"]


def export_model(
    plugin: ArchitecturePlugin,
    model: Seq2SeqModel,
    config: Any,
    src_vocab: Vocabulary,
    tgt_vocab: Vocabulary,
    out_dir: str | Path,
    *,
    checkpoint_path: Path,
    source: str,
    samples: Sequence[str] = (),
    training: dict[str, Any] | None = None,
    search: dict[str, Any] | None = None,
    exporter: str | None = None,
    opset: int = DEFAULT_OPSET,
    with_attention: bool = False,
    alignment_heads: tuple[tuple[int, int], ...] = (),
    multi_step: bool = False,
    optimize: bool = False,
    ort_format: bool = False,
    force: bool = False,
    include_checkpoint: bool = True,
) -> ExportReport:
    """``optimize`` stores the graphs as ONNX Runtime's extended optimisations leave them (fused,
    still portable across machines); ``ort_format`` adds ``.ort`` copies for ORT's mobile and
    minimal builds. Every variant written is compared against PyTorch like the plain export.
    Without ``include_checkpoint`` the folder holds only what a deployment loads; the manifest
    still names the checkpoint and its sha256, for ``parity --checkpoint``. ``search``: the
    model's own decoding defaults (the manifest's ``search`` names), over the generic ones.
    ``alignment_heads``: the decoder's ``attention`` output holds these (layer, head) pairs' cross-attention
    (word timestamps), recorded in the manifest. ``multi_step`` adds ``decoder_multi.onnx``, the
    k-position step speculative greedy verifies drafts with; opt-in, as it costs a second decoder
    export and check, and pays only where a step is bound by weight bytes."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not force:
        raise S2SError(f"{out_dir} already exists; pass --force to replace it")
    if with_attention and not plugin.has_attention:
        raise S2SError(f"architecture {plugin.name!r} has no attention weights to export")
    _check_finite(plugin, model)
    exporter = exporter or plugin.exporter
    memory, state = plugin.memory_specs(config), plugin.state_specs(config)
    specs = _Specs(memory, state, io_names(memory, state, with_attention or bool(alignment_heads)),
                   plugin.source_spec(config),
                   bool(getattr(model, "memory_per_sentence", False)))
    if specs.source.is_features:
        check_frontend(plugin.name, specs.source)
        samples = ()  # text samples are no input to an encoder of features
    model = model.eval()
    encoder = EncoderGraph(model, memory, state).eval()
    if with_attention and alignment_heads:
        raise S2SError("--with-attention exports every head, word timestamps only the alignment heads: pick one")
    step = StepGraph(model, memory, state, with_attention, alignment_heads).eval()
    if multi_step and not model.multi_step:
        raise S2SError(f"--multi-step: the {plugin.name} model has no k-position decoder step (its plugin does not "
                       "declare multi_step)")
    multi = MultiStepGraph(model, memory, state).eval() if multi_step else None

    with staged_directory(out_dir, force) as work:
        enc_args = _encoder_inputs(specs.source, len(src_vocab), _EXAMPLE)
        with plugin_errors(plugin.name, "encode() on example inputs"):
            _check_encoder(plugin, model, specs, enc_args)
            check_encoder_axes_torch(encoder, specs.io.encoder_outputs, memory, state, len(src_vocab),
                                     specs.source)
            check_model_torch(plugin, model, config, src_vocab, tgt_vocab)
            vocab_sizes = (len(src_vocab), len(tgt_vocab))
            dec_args = _decoder_inputs(encoder, specs, vocab_sizes, _EXAMPLE)
            check_batch_axes(plugin.name, "state", specs.state, dec_args[3 + len(specs.memory):],
                             specs.rows(_EXAMPLE))
            enc_axes = _dynamic_axes(encoder, enc_args, _encoder_inputs(specs.source, len(src_vocab), _PROBE))
        with plugin_errors(plugin.name, "decode_step() on example inputs"):
            dec_axes = _dynamic_axes(step, dec_args, _decoder_inputs(encoder, specs, vocab_sizes, _PROBE))
        with plugin_errors(plugin.name, f"{exporter} export of the encoder"):
            _export(encoder, enc_args, work / ENCODER_FILE, specs.io.encoder_inputs, specs.io.encoder_outputs,
                    enc_axes, exporter, opset)
        with plugin_errors(plugin.name, f"{exporter} export of the decoder step"):
            _export(step, dec_args, work / DECODER_FILE, specs.io.decoder_inputs, specs.io.decoder_outputs,
                    dec_axes, exporter, opset, _past_rows(specs))
        _add_top_k(work / DECODER_FILE)
        graph_paths = (work / ENCODER_FILE, work / DECODER_FILE)
        if multi is not None:
            with plugin_errors(plugin.name, f"{exporter} export of the k-position decoder step"):
                _export_multi(multi, encoder, specs, vocab_sizes, work / MULTI_FILE, exporter, opset)
            _add_top_k(work / MULTI_FILE)
        all_paths = graph_paths + ((work / MULTI_FILE,) if multi is not None else ())
        for path in all_paths:
            _check_graph(path)
            if optimize:
                _ort_optimize(path, path, "onnx")
        diffs = _compare_with_onnxruntime(encoder, step, specs, graph_paths, len(src_vocab), len(tgt_vocab),
                                          plugin.parity_atol, plugin.parity_rtol)
        forward_step = run_export_checks(plugin, model, config, src_vocab, tgt_vocab, graph_paths, samples,
                                         plugin_tolerance(plugin))
        multi_diff = {}
        if multi is not None:
            src, src_len = (t.numpy() for t in _encoder_inputs(specs.source, len(src_vocab),
                                                                {"batch": 2, "src_len": 6, "past_len": 0}))
            found = check_multi_step(plugin.name, model, all_paths, specs.memory, specs.state, src, src_len,
                                     len(tgt_vocab), plugin_tolerance(plugin))
            multi_diff = {"multi_step_max_abs_diff": found.max_abs_diff}
        write_files((src_vocab.tokenizer, tgt_vocab.tokenizer), work)
        if include_checkpoint:
            shutil.copyfile(checkpoint_path, work / CHECKPOINT_FILE)
        manifest = Manifest.build(
            work, plugin=(plugin.name, plugin.version, plugin.description, REGISTRY.origin(plugin)),
            config=dataclasses.asdict(config),
            source=source, exporter=exporter, opset=opset, graphs=_graph_io(specs, work, multi is not None),
            memory=specs.memory,
            state=specs.state, src_vocab=src_vocab, tgt_vocab=tgt_vocab,
            limits=(plugin.max_source_length(config), plugin.max_target_length(config)),
            search={**plugin.search_defaults(config), **_length_limit(training or {}), **(search or {})},
            validation={"atol": plugin.parity_atol, "rtol": plugin.parity_rtol, "max_abs_diff": diffs,
                        "forward_step_max_abs_diff": forward_step.max_abs_diff, **multi_diff},
            samples=samples, training=training or {}, ort_optimized=optimize,
            checkpoint=CheckpointEntry(CHECKPOINT_FILE, sha256_of(checkpoint_path), include_checkpoint),
            encoder_input=specs.source, memory_per_sentence=specs.memory_per_sentence,
            alignment_heads=alignment_heads,
        )
        roles = ("encoder", "decoder", "decoder_multi")
        for role, path in zip(roles, all_paths, strict=False):
            _write_metadata(path, manifest.graph_facts(role))
        shared = share_weights(all_paths)
        for role, path in zip(roles, all_paths, strict=False):
            manifest = manifest.with_graph(role, path, shared.get(path))
        if ort_format:
            ort_paths = tuple(path.with_suffix(".ort") for path in graph_paths)
            for path, ort_path in zip(graph_paths, ort_paths, strict=True):
                _ort_optimize(path, ort_path, "ort")
            _compare_with_onnxruntime(encoder, step, specs, ort_paths, len(src_vocab), len(tgt_vocab),
                                      plugin.parity_atol, plugin.parity_rtol)
            for role, ort_path in zip(("encoder", "decoder"), ort_paths, strict=True):
                manifest = manifest.with_ort_graph(role, ort_path)
        manifest.write()
    sizes = {name: (out_dir / name).stat().st_size for name in (ENCODER_FILE, DECODER_FILE)}
    return ExportReport(out_dir, exporter, diffs, sizes)


def _check_encoder(plugin: ArchitecturePlugin, model: Seq2SeqModel, specs: _Specs,
                   args: tuple[torch.Tensor, ...]) -> None:
    """encode() must return every memory and state-init tensor, each with the batch on its declared axis."""
    with torch.no_grad():
        encoded = model.encode(*args)
    inits = [s for s in specs.state if s.init == "encoder"]
    check_encoded(plugin.name, encoded, [m.name for m in specs.memory] + [s.name for s in inits])
    batch = args[0].shape[0]
    check_batch_axes(plugin.name, "memory", specs.memory, [encoded[m.name] for m in specs.memory], batch)
    check_batch_axes(plugin.name, "state", inits, [encoded[s.name] for s in inits], batch)


def _check_finite(plugin: ArchitecturePlugin, model: Seq2SeqModel) -> None:
    """NaN or inf weights make NaN log-probs, which compare as "no difference": refuse them first."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise S2SError(f"{plugin.name}: weight {name} holds NaN or inf; the checkpoint is broken (retrain or "
                           "restore it)")


def _encoder_inputs(source: SourceSpec, vocab_size: int, sizes: dict[str, int]) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(sizes["src_len"])
    batch, length = sizes["batch"], sizes["src_len"]
    if source.is_features:
        src = torch.randn((batch, *source.item_shape(length)), generator=generator).to(getattr(torch, source.dtype))
    else:
        src = torch.randint(4, vocab_size, (batch, length), generator=generator)
    if source.length_axis is None:  # fixed-size items: one each
        return src, torch.ones(batch, dtype=torch.int64)
    src_len = torch.tensor([length - i % 3 for i in range(batch)], dtype=torch.int64)
    return src, src_len


def _zeros(spec: StateSpec, batch: int, past_len: int) -> torch.Tensor:
    return torch.zeros(spec.zeros_shape(batch, past_len), dtype=getattr(torch, spec.dtype))


def _decoder_inputs(
    encoder: EncoderGraph, specs: _Specs, vocab_sizes: tuple[int, int], sizes: dict[str, int],
    past_len: int | None = None,
) -> tuple[torch.Tensor, ...]:
    """Decoder inputs with a non-empty past, so tracing sees the growing axis as dynamic.
    ``vocab_sizes`` is (source, target): the encoder reads source ids, the step target ids. The
    memory has one row per sentence; the tokens and state ``specs.rows`` rows, sentence-major."""
    src_vocab_size, vocab_size = vocab_sizes
    past_len = sizes["past_len"] if past_len is None else past_len
    batch = specs.rows(sizes)
    per_sentence = batch // sizes["batch"]
    with torch.no_grad():
        example = _encoder_inputs(specs.source, src_vocab_size, sizes)
        encoded = dict(zip(specs.io.encoder_outputs, encoder(*example), strict=True))
    generator = torch.Generator().manual_seed(past_len)
    tokens = torch.randint(4, vocab_size, (batch,), generator=generator)
    reorder = torch.arange(batch - 1, -1, -1, dtype=torch.int64)
    memory = [encoded[m.name] for m in specs.memory]
    past = []
    for spec in specs.state:
        if spec.init == "encoder":
            past.append(encoded[init_name(spec.name)].repeat_interleave(per_sentence, spec.batch_axis))
        else:
            past.append(torch.randn(_zeros(spec, batch, past_len).shape, generator=generator))
    return (tokens, torch.tensor(past_len, dtype=torch.int64), reorder, *memory, *past)


def _dynamic_axes(
    module: torch.nn.Module, example: tuple[torch.Tensor, ...], probe: tuple[torch.Tensor, ...]
) -> dict[str, Any]:
    """Find the dynamic axes of every input and output by running two sizes and diffing shapes.

    Generic: no plugin declares its source-length axes; they show up as differing dims.
    """
    with torch.no_grad():
        outs_a, outs_b = module(*example), module(*probe)
    inputs = [_differing_axes(a, b) for a, b in zip(example, probe, strict=True)]
    outputs = [_differing_axes(a, b) for a, b in zip(outs_a, outs_b, strict=True)]
    return {"inputs": inputs, "outputs": outputs}


def _differing_axes(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    if a.dim() != b.dim():
        raise ExportShapeError(f"a tensor changes rank between input sizes ({a.dim()} vs {b.dim()})")
    return [i for i, (x, y) in enumerate(zip(a.shape, b.shape, strict=True)) if x != y]


def _axis_name(tensor: torch.Tensor, axis: int, sizes: dict[str, int]) -> str:
    size = tensor.shape[axis]
    for name, value in sizes.items():
        if value == size:
            return name
    if size == sizes["past_len"] + 1:
        return "past_len_plus_1"
    return f"size{size}"  # one name per size: a length derived from src_len (e.g. downsampled) stays one axis


def _past_rows(specs: _Specs) -> dict[tuple[int, int], str]:
    """The decoder's past state has rows of its own: a beam's first step after the narrow one
    reads one row per sentence and ``reorder`` widens them. Named apart from the tokens' rows, a
    shape the graph computes from the rows (a head split over per-sentence memory) is never read
    off a past input."""
    first = 3 + len(specs.memory)
    return {(first + i, s.batch_axis): "past_rows" for i, s in enumerate(specs.state)}


def _export(
    module: torch.nn.Module, args: tuple[torch.Tensor, ...], path: Path, input_names: tuple[str, ...],
    output_names: tuple[str, ...], axes: dict[str, Any], exporter: str, opset: int,
    renamed: dict[tuple[int, int], str] | None = None,
) -> None:
    """``renamed``: (input index, axis) → the name of a dynamic axis that must stay its own."""
    renamed = renamed or {}

    def name(index: int, tensor: torch.Tensor, axis: int) -> str:
        return renamed.get((index, axis)) or _axis_name(tensor, axis, _EXAMPLE)

    with torch.no_grad():
        outputs = module(*args)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    if exporter == "dynamo":
        dims: dict[str, torch.export.Dim] = {}

        def dim(name: str) -> torch.export.Dim:
            return dims.setdefault(name, torch.export.Dim(name, min=1 if name == "batch" else 0))

        per_arg = [
            {axis: dim(name(index, arg, axis)) for axis in arg_axes} or None
            for index, (arg, arg_axes) in enumerate(zip(args, axes["inputs"], strict=True))
        ]
        dynamic_shapes = _group_varargs(module, per_arg)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                module, args, dynamo=True, input_names=list(input_names), output_names=list(output_names),
                dynamic_shapes=dynamic_shapes, opset_version=opset, external_data=False, verbose=False,
            )
        program.save(str(path), external_data=False)
    else:
        dynamic_axes = {
            io_name: {axis: name(index, tensor, axis) for axis in tensor_axes}
            for index, (io_name, tensor, tensor_axes) in enumerate(zip(
                input_names + output_names, (*args, *outputs), axes["inputs"] + axes["outputs"], strict=True
            ))
            if tensor_axes
        }
        with warnings.catch_warnings(), quiet_native_output(fds=(2,)):  # C++ shape-inference chatter, not errors
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module, args, str(path), dynamo=False, input_names=list(input_names),
                output_names=list(output_names), dynamic_axes=dynamic_axes, opset_version=opset,
            )


def _group_varargs(module: torch.nn.Module, per_arg: list[Any]) -> tuple[Any, ...]:
    """torch.export wants a ``*tensors`` parameter's shapes as one nested tuple."""
    params = inspect.signature(module.forward).parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return tuple(per_arg)
    fixed = sum(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
    return (*per_arg[:fixed], tuple(per_arg[fixed:]))


def _export_multi(multi: MultiStepGraph, encoder: EncoderGraph, specs: _Specs, vocab_sizes: tuple[int, int],
                  path: Path, exporter: str, opset: int) -> None:
    """The k-position step, traced on a past of 5 positions with 1 rolled back: the memory has one
    row per token row (greedy), the token axis is dynamic (``positions``)."""
    one_per_row = dataclasses.replace(specs, memory_per_sentence=False)
    inputs, outputs = multi_io_names(specs.memory, specs.state)

    def example(sizes: dict[str, int], positions: int) -> tuple[torch.Tensor, ...]:
        _, step, _, *rest = _decoder_inputs(encoder, one_per_row, vocab_sizes, sizes)
        tokens = torch.randint(4, vocab_sizes[1], (sizes["batch"], positions),
                               generator=torch.Generator().manual_seed(positions))
        return (tokens, step - 1, torch.tensor(1, dtype=torch.int64), *rest)

    args = example(_EXAMPLE, MULTI_POSITIONS["example"])
    axes = _dynamic_axes(multi, args, example(_PROBE, MULTI_POSITIONS["probe"]))
    _export(multi, args, path, inputs, outputs, axes, exporter, opset, {(0, 1): "positions"})


def _add_top_k(path: Path) -> None:
    """Append a TopK over ``log_probs``: a search then fetches K candidates per row instead of
    the whole vocabulary, which at 32k tokens is most of a small step's copying and numpy work.
    ``top_k`` is a required input: an input backed by an initializer (a default) is dropped
    from ``inputNames`` and ignored by onnxruntime-node, so a portable graph has none."""
    model, read = load_graph(path)
    graph = model.graph
    log_probs = next(o for o in graph.output if o.name == "log_probs")
    leading = [d.dim_param or d.dim_value for d in log_probs.type.tensor_type.shape.dim[:-1]]  # rows (, positions)
    graph.input.append(onnx.helper.make_tensor_value_info(TOP_K, onnx.TensorProto.INT64, [1]))
    graph.node.append(onnx.helper.make_node("TopK", ["log_probs", TOP_K], list(TOP_OUTPUTS), axis=-1,
                                            largest=1, sorted=1, name="search/TopK"))
    for name, dtype in zip(TOP_OUTPUTS, (onnx.TensorProto.FLOAT, onnx.TensorProto.INT64), strict=True):
        graph.output.append(onnx.helper.make_tensor_value_info(name, dtype, [*leading, TOP_K]))
    save_graph(model, path, read)


def _check_graph(path: Path) -> None:
    try:
        onnx.checker.check_model(str(path), full_check=True)
        # the shapes need no weights: a graph past 2 GB is inferred without loading its data
        graph = onnx.load(str(path), load_external_data=False)
        onnx.shape_inference.infer_shapes(graph, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise S2SError(f"{path.name} fails the ONNX checker: {str(exc).splitlines()[0]}") from exc


def _ort_optimize(source: Path, target: Path, file_format: str) -> None:
    """Let ONNX Runtime optimise and save a graph. The extended level fuses (e.g. LayerNorm,
    attention) without the layout-specific rewrites of the "all" level, so the file stays portable."""
    import onnxruntime as ort

    if external_files(source):
        raise S2SError(f"{source.name} is past 2 GB, and ONNX Runtime saves an optimised graph as one file: "
                       "export without --optimize (ONNX Runtime applies the same optimisations when it loads it)")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.log_severity_level = 3
    scratch = target.with_name(f".{target.name}.opt")
    options.optimized_model_filepath = str(scratch)
    if file_format == "ort":
        options.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    scratch.replace(target)


def _compare_with_onnxruntime(
    encoder: EncoderGraph, step: StepGraph, specs: _Specs, paths: tuple[Path, Path], src_vocab_size: int,
    tgt_vocab_size: int, atol: float, rtol: float = DEFAULT_RTOL,
) -> dict[str, float]:
    """Run both graphs in ONNX Runtime on fresh sizes, from an empty cache through several
    reordered steps, and fail on any shape mismatch or difference above the plugin's atol. Where
    the memory is per sentence, ONNX Runtime gets it so, against PyTorch on it repeated per row:
    that checks the model's ``memory_per_sentence`` claim."""
    from s2s_deploy.runtime.ort.backend import create_session

    enc_sess = create_session(paths[0], device="cpu")
    dec_sess = create_session(paths[1], device="cpu")
    dec_inputs = {i.name for i in dec_sess.get_inputs()}
    sizes = {"batch": 2, "src_len": 6, "past_len": 0}
    src, src_len = _encoder_inputs(specs.source, src_vocab_size, sizes)
    diffs: dict[str, float] = {}
    with torch.no_grad():
        torch_enc = encoder(src, src_len)
    ort_enc = enc_sess.run(list(specs.io.encoder_outputs), {"src": src.numpy(), "src_len": src_len.numpy()})
    _record(diffs, specs.io.encoder_outputs, torch_enc, ort_enc, "encoder")
    encoded = dict(zip(specs.io.encoder_outputs, torch_enc, strict=True))
    group = 2 if specs.memory_per_sentence else 1
    rows = 2 * group
    memory = [encoded[m.name] for m in specs.memory]
    repeated = [value.repeat_interleave(group, m.batch_axis) for m, value in zip(specs.memory, memory, strict=True)]
    state = [encoded[init_name(s.name)].repeat_interleave(group, s.batch_axis) if s.init == "encoder"
             else _zeros(s, rows, 0) for s in specs.state]
    generator = torch.Generator().manual_seed(0)
    tolerance, searchable = StepTolerance(atol, rtol), NO_DIFF
    for position in range(4):
        tokens = torch.randint(4, tgt_vocab_size, (rows,), generator=generator)
        # every other step swaps the pasts: within each sentence where the memory is per sentence
        reorder = torch.arange(rows, dtype=torch.int64)
        if position % 2:
            reorder = reorder.reshape(-1, group if group > 1 else rows).flip(1).reshape(-1)
        head = (tokens, torch.tensor(position, dtype=torch.int64), reorder)
        with torch.no_grad():
            torch_out = step(*head, *repeated, *state)
        args = (*head, *memory, *state)
        feeds = {name: arg.numpy() for name, arg in zip(specs.io.decoder_inputs, args, strict=True)
                 if name in dec_inputs}
        feeds[TOP_K] = np.array([3], dtype=np.int64)
        ort_out = dec_sess.run([*specs.io.decoder_outputs, TOP_OUTPUTS[0]], feeds)
        top = torch.topk(torch_out[0], 3, dim=-1).values
        _record(diffs, (*specs.io.decoder_outputs, TOP_OUTPUTS[0]), (*torch_out, top), ort_out, "decoder")
        searchable = searchable.merge(tolerance.compare(torch_out[0].numpy(), ort_out[0]))
        state = list(torch_out[1 : 1 + len(specs.state)])
    # log-probs count where a search can act (verify/tolerance.py); every other output within atol
    worst = {name: diff for name, diff in diffs.items() if diff > atol and not name.endswith("log_probs")}
    if searchable.worst > 1.0:
        worst["decoder.log_probs"] = searchable.max_abs_diff
    if worst:
        listed = ", ".join(f"{name} {diff:.2e}" for name, diff in sorted(worst.items()))
        raise ExportToleranceError(f"ONNX Runtime differs from PyTorch above atol {atol:g}: {listed}")
    return diffs


def _record(
    diffs: dict[str, float], names: tuple[str, ...], expected: Sequence[torch.Tensor],
    actual: Sequence[np.ndarray], graph: str,
) -> None:
    for name, want, got in zip(names, expected, actual, strict=True):
        want_np = want.numpy()
        if want_np.shape != got.shape:
            raise ExportShapeError(f"{graph} output {name}: ONNX shape {got.shape}, PyTorch {want_np.shape}")
        if not want_np.size:
            diff = 0.0
        elif name == "log_probs":  # compared where a search can act, as parity does
            diff = StepTolerance().compare(want_np, got).max_abs_diff
        else:
            diff = float(np.max(np.abs(want_np.astype(np.float64) - got)))
        if not np.isfinite(diff):  # max(0.0, nan) is 0.0: NaN on both sides must not pass as "no difference"
            raise ExportToleranceError(f"{graph} output {name} is not finite (NaN or inf) in PyTorch or ONNX Runtime")
        key = f"{graph}.{name}"
        diffs[key] = max(diffs.get(key, 0.0), diff)


def _io_entries(names: tuple[str, ...], roles: dict[str, str], graph: onnx.GraphProto, kind: str) -> list[IOEntry]:
    values = {v.name: v for v in getattr(graph, kind)}
    entries = []
    for name in names:
        if kind == "input" and name not in values:
            continue  # an input the model never reads; the TorchScript exporter drops it
        tensor_type = values[name].type.tensor_type
        shape = [d.dim_param or d.dim_value for d in tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name
        entries.append(IOEntry(name, roles[name], dtype, tuple(shape)))
    return entries


def _roles(specs: _Specs) -> dict[str, str]:
    roles = {"src": "source_features" if specs.source.is_features else "source_tokens",
             "src_len": "source_lengths", "tokens": "previous_tokens",
             "step": "step_index", "reorder": "beam_reorder", ROLLBACK: "cache_rollback", "log_probs": "log_probs",
             "attention": "cross_attention", TOP_K: "top_k", TOP_OUTPUTS[0]: "top_log_probs",
             TOP_OUTPUTS[1]: "top_ids"}
    roles.update({m.name: "memory" for m in specs.memory})
    for s in specs.state:
        roles.update({init_name(s.name): "state_init", past_name(s.name): "state_in",
                      present_name(s.name): "state_out"})
    return roles


def _graph_io(specs: _Specs, work: Path, multi: bool) -> dict[str, tuple[str, list[IOEntry], list[IOEntry]]]:
    """Each graph's file and the inputs and outputs it declares, with their roles, for the manifest."""
    roles = _roles(specs)
    graphs = {}
    listed = [("encoder", ENCODER_FILE, specs.io.encoder_inputs, specs.io.encoder_outputs),
              ("decoder", DECODER_FILE, (*specs.io.decoder_inputs, TOP_K), (*specs.io.decoder_outputs, *TOP_OUTPUTS))]
    if multi:
        inputs, outputs = multi_io_names(specs.memory, specs.state)
        listed.append(("decoder_multi", MULTI_FILE, (*inputs, TOP_K), (*outputs, *TOP_OUTPUTS)))
    for role, file, inputs, outputs in listed:
        graph = onnx.load(str(work / file), load_external_data=False).graph
        graphs[role] = (file, _io_entries(inputs, roles, graph, "input"), _io_entries(outputs, roles, graph, "output"))
    return graphs


def _length_limit(training: dict[str, Any]) -> dict[str, float]:
    """The relative length limit the trainer measured on its data, as the export's default."""
    recorded = training.get("search", {})
    limit = {key: recorded[key] for key in ("max_len_a", "max_len_b") if key in recorded}
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < 1e6 for v in limit.values()):
        raise S2SError(f"the checkpoint records an invalid length limit: {limit}")
    return limit


def _write_metadata(path: Path, facts: dict[str, str]) -> None:
    """Key facts inside the graph too (``Manifest.graph_facts``), so a lone .onnx file still says
    what it is; the exporter's per-node debug records go, as they only repeat the source tree."""
    model, read = load_graph(path)
    del model.metadata_props[:]
    for key, value in facts.items():
        model.metadata_props.add(key=key, value=value)
    for node in model.graph.node:  # exporter debug info: stack traces with local paths, ~5% of a small file
        del node.metadata_props[:]
        node.doc_string = ""
    model.producer_name = "s2s-deploy"
    save_graph(model, path, read)  # the external files it writes are listed after share_weights
