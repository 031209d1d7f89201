"""Docs that run: every Python block of README.md and docs/**/*.md is executed here, on CPU, as a
reader would run it, with tiny models standing in for the checkpoints the pages name.

What a block needs is written in the page, in HTML comments (GitHub does not render them) right
above the block's opening fence; several may stand there, one after the other:

    <!-- docs-test: page-setup            code run first in the namespace of every block of the page
    CODE -->                              (anywhere on the page, outside a block)
    <!-- docs-test: setup                 code run before this block, after the page's setup
    CODE -->
    <!-- docs-test: check                 code run after this block, in its namespace: what the
    CODE -->                              block's result must satisfy
    <!-- docs-test: continue -->          a fragment of the page's previous Python block: it runs in
                                          the namespace that block left (after its own setup, if any)
    <!-- docs-test: replace "OLD" "NEW" -->  OLD in the block's text replaced by NEW before it runs
                                          (a path of the reader's machine); {tmp} in NEW is a fresh
                                          temporary directory
    <!-- docs-test: signature -->         the block lists signatures, `name(parameters) -> result`:
                                          each is checked against inspect.signature of what `name`
                                          is in the page's namespace (names, kinds, defaults)
    <!-- docs-test: skip (REASON) -->     not run, reported as skipped with REASON: a block that needs
                                          a GPU, several processes (torchrun) or the network

Every other block runs in a fresh namespace: the page's setup, the block's setup, the block, its
check. Each runs in a temporary working directory, with a fixed seed, and a NothingOffloadedWarning
is an error: an example must offload something on its stand-ins.

The stand-ins, all on CPU and small enough that the whole file runs in a few minutes:

- A checkpoint a block loads with `from_pretrained` (transformers' Auto classes and models,
  diffusers' models, and the tokenizer or processor of the same name) is built from CHECKPOINTS
  below: a small random model of the same class, in the dtype the block asks for. A name missing from CHECKPOINTS fails the block, naming it (nothing is downloaded).
- `.cuda()` of modules and tensors returns them unchanged, so a block written for a GPU runs on CPU
  (with or without a GPU on the machine, the blocks run on CPU). Nothing else about devices changes.
- The namespace holds the builders of STAND_INS (`tiny_llama()`, `tiny_batch(model)`, ...), which
  the pages' setup code calls to make the `model`, `batch` and `loader` their blocks use.

pytest's terminal summary ends with a "docs examples" section: how many blocks ran, how many
signature blocks were checked, and each block skipped with its reason. test_docs.py checks the
pages' links and the torch_offload names they show.
"""
import ast
import contextlib
import inspect
import linecache
import re
import socket
import sys
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from python_tests.support.markdown import DOCS, FENCE, ROOT, closes

torch = pytest.importorskip("torch")

_DIRECTIVE = re.compile(r"<!--\s*docs-test:\s*(.*?)-->", re.S)
_KINDS = ("page-setup", "setup", "check", "continue", "replace", "signature", "skip")
_PYTHON = ("python", "py")


# --- Reading the pages. ---

@dataclass
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    code: str
    setup: list = field(default_factory=list)
    checks: list = field(default_factory=list)
    replacements: list = field(default_factory=list)
    continues: bool = False
    signature: bool = False
    skip: str = None  # the reason

    @property
    def id(self):
        doc = self.doc.relative_to(ROOT) if self.doc.is_relative_to(ROOT) else self.doc.name
        return f"{doc}:{self.line}"


@dataclass
class Page:
    doc: Path
    setup: list = field(default_factory=list)
    blocks: list = field(default_factory=list)


class DirectiveError(ValueError):
    pass


def _directive(text: str, where: str):
    """(kind, argument, code) of one `docs-test:` comment's text."""
    head, _, code = text.partition("\n")
    head = head.strip()
    kind = head.split(None, 1)[0] if head else ""
    if kind not in _KINDS:
        raise DirectiveError(f"{where}: unknown docs-test directive {head!r}; known: {', '.join(_KINDS)}")
    argument = head[len(kind):].strip()
    if kind == "skip":
        reason = re.fullmatch(r"\((.+)\)", argument)
        if not reason:
            raise DirectiveError(f"{where}: skip needs its reason in parentheses: skip (needs a GPU)")
        argument = reason.group(1).strip()
    elif kind == "replace":
        pair = re.fullmatch(r'"([^"]+)"\s+"([^"]*)"', argument)
        if not pair:
            raise DirectiveError(f'{where}: replace takes two quoted strings: replace "OLD" "NEW"')
        argument = pair.groups()
    elif argument:
        raise DirectiveError(f"{where}: {kind} takes no argument on its line (its code goes on the next lines)")
    if kind in ("page-setup", "setup", "check") and not code.strip():
        raise DirectiveError(f"{where}: {kind} has no code")
    if kind not in ("page-setup", "setup", "check") and code.strip():
        raise DirectiveError(f"{where}: {kind} takes no code")
    return kind, argument, code


def parse_page(doc: Path, text: str = None) -> Page:
    """The page's Python blocks with their directives. A directive belongs to the fenced block right
    below it (only blank lines and other directives between); page-setup to the whole page."""
    text = doc.read_text(encoding="utf-8") if text is None else text
    lines = text.splitlines()
    page, pending, fence, body, info, start = Page(doc), [], None, None, "", 0
    i = 0
    while i < len(lines):
        line = lines[i]
        where = f"{doc.name}:{i + 1}"
        if fence is not None:
            marker = FENCE.match(line)
            if marker and closes(fence, marker.group(1), line):
                if info in _PYTHON:
                    page.blocks.append(_block(doc, start, "\n".join(body), pending))
                elif pending:
                    raise DirectiveError(f"{doc.name}:{start}: docs-test directives above a {info or 'plain'} block")
                fence, pending = None, []
            else:
                body.append(line)
            i += 1
            continue
        marker = FENCE.match(line)
        if marker:
            fence, body, start = marker.group(1), [], i + 1
            info = (line.strip()[len(fence):].split() or [""])[0].lower()  # the language
            i += 1
            continue
        if line.lstrip().startswith("<!--") and "docs-test:" in line:
            end = i
            while "-->" not in lines[end]:
                end += 1
                if end == len(lines):
                    raise DirectiveError(f"{where}: unclosed docs-test comment")
            comment = "\n".join(lines[i:end + 1])
            match = _DIRECTIVE.search(comment)
            if not match or comment.strip() != match.group(0).strip():
                raise DirectiveError(f"{where}: a docs-test comment must stand alone on its lines")
            kind, argument, code = _directive(match.group(1), where)
            # The code keeps its line numbers in the page, for tracebacks.
            code = "\n" * (i + 1) + code
            if kind == "page-setup":
                page.setup.append(code)
            else:
                pending.append((kind, argument, code, where))
            i = end + 1
            continue
        if line.strip() and pending:
            raise DirectiveError(f"{pending[0][3]}: docs-test directive not followed by a code block")
        i += 1
    if pending:
        raise DirectiveError(f"{pending[0][3]}: docs-test directive not followed by a code block")
    for previous, block in zip([None] + page.blocks, page.blocks):
        if block.continues and (previous is None or previous.skip or previous.signature):
            raise DirectiveError(f"{block.id}: continue needs a previous Python block that runs")
    return page


def _block(doc, start, code, directives):
    block = Block(doc, start, "\n" * start + code)
    for kind, argument, text, where in directives:
        if kind == "setup":
            block.setup.append(text)
        elif kind == "check":
            block.checks.append(text)
        elif kind == "replace":
            block.replacements.append(argument)
        elif kind == "continue":
            block.continues = True
        elif kind == "signature":
            block.signature = True
        elif kind == "skip":
            block.skip = argument
    if block.skip and (block.setup or block.checks or block.continues or block.signature):
        raise DirectiveError(f"{block.id}: skip takes no other directive")
    return block


def _pages():
    return [parse_page(doc) for doc in DOCS]


PAGES = _pages()
BLOCKS = [block for page in PAGES for block in page.blocks]
_PAGE_OF = {block.id: page for page in PAGES for block in page.blocks}


# --- Stand-ins. ---

VOCAB = 256


def _llama_config(layers=2, **overrides):
    from transformers import LlamaConfig

    config = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                  attn_implementation="sdpa")
    config.update(overrides)
    return LlamaConfig(**config)


def tiny_llama(layers=2, dtype=None, name="tiny-llama"):
    """A random LlamaForCausalLM of `layers` decoder layers of width 64, vocabulary 256, in training mode."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(_llama_config(layers))
    model.config._name_or_path = name
    if dtype is not None:
        model = model.to(dtype)
    return model.train()


def tiny_batch(model=None, tokens=64, batch=1):
    """A causal-LM batch: input_ids and labels (the same ids), `tokens` long."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (batch, tokens), generator=generator)
    device = next(model.parameters()).device if model is not None else "cpu"
    return {"input_ids": ids.to(device), "labels": ids.to(device)}


def tiny_loader(model=None, steps=2, tokens=64):
    """`steps` causal-LM batches."""
    return [tiny_batch(model, tokens) for _ in range(steps)]


def tiny_dataset(rows=4, tokens=32):
    """A datasets.Dataset of token ids (input_ids and labels), as a Trainer takes it."""
    import datasets

    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (rows, tokens), generator=generator).tolist()
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})


def tiny_tokenizer():
    """A word-level tokenizer over the tiny Llama's ids, built in memory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, **{f"t{i}": i for i in range(1, VOCAB)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", pad_token="<eos>")


class _Block(torch.nn.Module):
    """A pre-norm transformer block with SDPA attention and an MLP, called as block(x) or
    block(x, attention_mask=mask)."""

    def __init__(self, width=64, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.out = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x, attention_mask=None):
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        attention = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=attention_mask, is_causal=attention_mask is None)
        x = x + self.out(attention.transpose(1, 2).reshape(b, s, w))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class _Stack(torch.nn.Module):
    """A model that is not a Hugging Face one: blocks in `layers`, called on embeddings."""

    def __init__(self, layers=3, width=64):
        super().__init__()
        self.layers = torch.nn.ModuleList(_Block(width) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def tiny_block(width=64):
    """One transformer block (SDPA attention, MLP) and an input for it: (block, x)."""
    torch.manual_seed(0)
    return _Block(width).train(), torch.randn(2, 64, width, requires_grad=True)


def tiny_stack(layers=3, width=64):
    """A plain torch model with its blocks in `.layers`, and an input for it: (model, x)."""
    torch.manual_seed(0)
    return _Stack(layers, width).train(), torch.randn(2, 64, width, requires_grad=True)


_WAN = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
            text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads")


def tiny_wan(dtype=None):
    """A random diffusers WanTransformer3DModel: 2 blocks of width 32."""
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(**_WAN)
    if dtype is not None:
        keep = set(model._keep_in_fp32_modules or ())  # as from_pretrained(torch_dtype=...) leaves them
        with torch.no_grad():
            for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
                if tensor.is_floating_point():
                    tensor.data = tensor.data.to(torch.float32 if keep & set(name.split(".")) else dtype)
    return model.train()


def tiny_video_batch(dtype=torch.float32):
    """Flow-matching inputs for the tiny Wan model: (noisy_latents, timestep, text_embeddings, noise,
    latents), 4 latent frames of 8 x 8; the model's inputs in `dtype`."""
    generator = torch.Generator().manual_seed(1)
    latents = torch.randn(1, _WAN["in_channels"], 4, 8, 8, generator=generator)
    noise = torch.randn(latents.shape, generator=generator)
    sigma = torch.rand(1, generator=generator)
    noisy = ((1 - sigma) * latents + sigma * noise).to(dtype)
    text = torch.randn(1, 8, _WAN["text_dim"], generator=generator).to(dtype)
    return noisy, sigma * 1000, text, noise, latents


# The checkpoints the pages load, and what stands in for each.
CHECKPOINTS = {
    "meta-llama/Llama-3.2-1B": lambda dtype=None: tiny_llama(dtype=dtype, name="meta-llama/Llama-3.2-1B"),
    "Wan-AI/Wan2.1-T2V-1.3B-Diffusers": lambda dtype=None: tiny_wan(dtype=dtype),
}
TOKENIZERS = {"meta-llama/Llama-3.2-1B": tiny_tokenizer}


class StandIns:
    """The builders a page's setup code calls; those that hold resources release them after the block."""

    def __init__(self, tmp_path, monkeypatch):
        self.tmp_path = tmp_path
        self.monkeypatch = monkeypatch
        self.finalizers = []

    def single_process_group(self):
        """torch.distributed initialised as one gloo rank (what torchrun --nproc_per_node=1 gives a
        script), destroyed after the block."""
        import torch.distributed as dist

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        self.finalizers.append(dist.destroy_process_group)
        # fully_shard's default mesh is on the accelerator where there is one; the blocks run on CPU.
        self.monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cpu"))

    def namespace(self):
        names = {name: globals()[name] for name in STAND_INS}
        names["single_process_group"] = self.single_process_group
        return names


STAND_INS = ("tiny_llama", "tiny_batch", "tiny_loader", "tiny_dataset", "tiny_tokenizer", "tiny_block",
             "tiny_stack", "tiny_wan", "tiny_video_batch")


def _from_checkpoint(kind, table):
    def from_pretrained(cls, name, *args, **kwargs):
        if name not in table:
            raise AssertionError(f"{kind} {name!r} has no stand-in: add one to CHECKPOINTS in "
                                 f"{Path(__file__).name}, or mark the block skip (needs the network)")
        if table is TOKENIZERS:
            return table[name]()
        made = table[name](dtype=kwargs.get("dtype", kwargs.get("torch_dtype")))
        if not cls.__name__.startswith("Auto") and not isinstance(made, cls):
            raise AssertionError(f"{cls.__name__}.from_pretrained({name!r}): the stand-in is a {type(made).__name__}")
        return made
    return classmethod(from_pretrained)


@contextlib.contextmanager
def _stand_ins(monkeypatch):
    try:
        import transformers
        from transformers.models.auto.auto_factory import _BaseAutoModelClass
    except ImportError:
        transformers = None
    if transformers is not None:
        # Each Auto class made so far holds a copy of the base's from_pretrained; later ones copy the patch.
        autos, pending = [_BaseAutoModelClass], [_BaseAutoModelClass]
        while pending:
            subclasses = pending.pop().__subclasses__()
            autos += subclasses
            pending += subclasses
        for auto in autos:
            if "from_pretrained" in vars(auto):
                monkeypatch.setattr(auto, "from_pretrained", _from_checkpoint("checkpoint", CHECKPOINTS))
        monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", _from_checkpoint("checkpoint", CHECKPOINTS))
        for auto in (transformers.AutoTokenizer, transformers.AutoProcessor):
            monkeypatch.setattr(auto, "from_pretrained", _from_checkpoint("tokenizer", TOKENIZERS))
    try:
        import diffusers
        monkeypatch.setattr(diffusers.ModelMixin, "from_pretrained", _from_checkpoint("checkpoint", CHECKPOINTS))
    except ImportError:
        pass
    monkeypatch.setattr(torch.nn.Module, "cuda", lambda self, device=None: self)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)
    try:
        yield
    finally:
        if "accelerate.state" in sys.modules:  # an Accelerator made by a block is process-wide state
            sys.modules["accelerate.state"].AcceleratorState._reset_state(True)


# --- Running the blocks. ---

_REPORT = {"ran": [], "signatures": [], "skipped": []}


class _Summary:
    """Adds the count of blocks run and skipped to pytest's terminal summary."""

    @staticmethod
    def pytest_terminal_summary(terminalreporter):
        if not any(_REPORT.values()):
            return
        ran, signatures, skipped = (len(_REPORT[k]) for k in ("ran", "signatures", "skipped"))
        terminalreporter.write_sep("-", "docs examples")
        terminalreporter.write_line(f"{ran + signatures} of {len(BLOCKS)} Python blocks executed ({ran} run, "
                                    f"{signatures} signature blocks checked), {skipped} skipped")
        for block_id, reason in _REPORT["skipped"]:
            terminalreporter.write_line(f"  skipped {block_id}: {reason}")


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    plugins = request.config.pluginmanager
    if not plugins.has_plugin("docs-examples-summary"):
        plugins.register(_Summary(), "docs-examples-summary")
    yield


def _exec(code: str, block: Block, namespace: dict, part: str):
    """Runs `code` in `namespace`, under a file name that says which page, block and part it is. Its
    lines go to linecache, so that tracebacks show them and inspect (torch.jit.script) finds them."""
    filename = f"{block.id.rpartition(':')[0]} ({part} of the block at line {block.line})"
    lines = code.splitlines(keepends=True)
    linecache.cache[filename] = (len(code), None, lines, filename)
    exec(compile(code, filename, "exec"), namespace)


def _module(block, monkeypatch):
    """A fresh module to run a block in (classes defined there need one, for inspect)."""
    name = "docs_block_" + re.sub(r"\W", "_", block.id)
    module = types.ModuleType(name)
    module.__file__ = f"{block.id.rpartition(':')[0]} (block at line {block.line})"
    monkeypatch.setitem(sys.modules, name, module)
    return module.__dict__


_NAMESPACES = {}  # block id -> the namespace it left, kept for the block that continues it
_CONTINUED = {page.blocks[i - 1].id for page in PAGES for i, b in enumerate(page.blocks) if b.continues}


def _namespace_for(block, page, stand_ins, monkeypatch):
    """The namespace `block` runs in: the one its previous block left (run again when it has not run in
    this pytest run, e.g. under -k), or a fresh one with the page's and the block's setup run."""
    if block.continues:
        previous = page.blocks[page.blocks.index(block) - 1]
        if previous.id not in _NAMESPACES:
            _run(previous, page, stand_ins, monkeypatch)
        namespace = _NAMESPACES[previous.id]
        for setup in block.setup:
            _exec(setup, block, namespace, "setup")
        return namespace
    namespace = _module(block, monkeypatch)
    namespace.update(stand_ins.namespace())
    for setup in page.setup:
        _exec(setup, block, namespace, "the page's setup")
    for setup in block.setup:
        _exec(setup, block, namespace, "setup")
    return namespace


def _run(block, page, stand_ins, monkeypatch):
    code = block.code
    for old, new in block.replacements:
        assert old in code, f"{block.id}: replace {old!r}: not in the block"
        code = code.replace(old, new.replace("{tmp}", str(stand_ins.tmp_path)))
    namespace = _namespace_for(block, page, stand_ins, monkeypatch)
    torch.manual_seed(0)
    if block.signature:
        _check_signatures(block, code, namespace)
    else:
        _exec(code, block, namespace, "code")
        for check in block.checks:
            _exec(check, block, namespace, "check")
    if block.id in _CONTINUED:
        _NAMESPACES[block.id] = namespace


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_docs_block_runs(block, tmp_path, monkeypatch):
    if block.skip:
        _REPORT["skipped"].append((block.id, block.skip))
        pytest.skip(block.skip)
    monkeypatch.chdir(tmp_path)
    stand_ins = StandIns(tmp_path, monkeypatch)
    try:
        with _stand_ins(monkeypatch), warnings.catch_warnings():
            # A block that offloads nothing on its stand-ins shows nothing: that is a failure here.
            import torch_offload
            warnings.simplefilter("error", torch_offload.NothingOffloadedWarning)
            _run(block, _PAGE_OF[block.id], stand_ins, monkeypatch)
    finally:
        for finalize in reversed(stand_ins.finalizers):
            finalize()
        if "compile" in block.code:
            torch._dynamo.reset()  # the graphs compiled for the block's stand-ins
    _REPORT["signatures" if block.signature else "ran"].append(block.id)


# --- Signatures. ---

def _signatures(code: str):
    """(name, `def` source) of each signature in a block: one starts at column 0, its continuation
    lines are indented; comments are dropped."""
    chunks = []
    for line in code.splitlines():
        line = re.sub(r"\s+#.*$", "", line) if "#" in line else line
        if not line.strip():
            continue
        if line[0].isspace() and chunks:
            chunks[-1] += " " + line.strip()
        else:
            chunks.append(line.strip())
    for chunk in chunks:
        name = re.match(r"([A-Za-z_][\w.]*)\(", chunk)
        assert name, f"not a signature: {chunk!r}"
        depth, end = 0, None
        for i, char in enumerate(chunk[name.end() - 1:], start=name.end() - 1):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                end = i
                break
        assert end is not None, f"unbalanced parentheses: {chunk!r}"
        rest = chunk[end + 1:].strip()
        result = rest[2:].strip() if rest.startswith("->") else None
        assert result is not None or not rest, f"after the parameters, only '-> result': {chunk!r}"
        yield name.group(1), f"def _({chunk[name.end():end]})" + (f" -> {result}" if result else "") + ": pass"


def _documented(source: str):
    """[(name, kind, default source or None)] of a `def` source."""
    args = ast.parse(source).body[0].args
    P = inspect.Parameter
    params = []
    positional = [(a, P.POSITIONAL_ONLY) for a in args.posonlyargs] + [(a, P.POSITIONAL_OR_KEYWORD) for a in args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for (arg, kind), default in zip(positional, defaults):
        params.append((arg.arg, kind, default))
    if args.vararg:
        params.append((args.vararg.arg, P.VAR_POSITIONAL, None))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        params.append((arg.arg, P.KEYWORD_ONLY, default))
    if args.kwarg:
        params.append((args.kwarg.arg, P.VAR_KEYWORD, None))
    return params


def _same_default(node, actual) -> bool:
    try:
        value = eval(compile(ast.Expression(node), "<default>", "eval"), {"__builtins__": {}})  # noqa: S307
    except NameError:  # a name, e.g. noop_context_fn: the default's own name
        names = {getattr(actual, "__name__", None), getattr(actual, "__qualname__", None)}
        return ast.unparse(node).split(".")[-1] in names
    # Equal, and a bool stays a bool (True == 1); a str subclass such as apply's default mode is a str.
    return value == actual and isinstance(value, bool) == isinstance(actual, bool)


def _signature(obj):
    """inspect.signature, or for an op (torch.ops.offload.*) its schema's arguments."""
    if isinstance(obj, torch._ops.OpOverloadPacket):
        P = inspect.Parameter
        return inspect.Signature([
            P(a.name, P.KEYWORD_ONLY if a.kwarg_only else P.POSITIONAL_OR_KEYWORD,
              default=a.default_value if a.has_default_value() else P.empty)
            for a in obj.default._schema.arguments])
    return inspect.signature(obj)


def _check_signatures(block, code, namespace):
    problems = []
    for name, source in _signatures(code):
        try:
            obj = eval(name, namespace)  # noqa: S307
        except Exception as error:  # noqa: BLE001
            problems.append(f"{name}: does not resolve ({type(error).__name__}: {error})")
            continue
        actual = list(_signature(obj).parameters.values())
        documented = _documented(source)
        if [(p.name, p.kind) for p in actual] != [(n, k) for n, k, _ in documented]:
            problems.append(f"{name}: documented {[(n, str(k)) for n, k, _ in documented]}, "
                            f"is {[(p.name, str(p.kind)) for p in actual]}")
            continue
        for param, (_, _, default) in zip(actual, documented):
            if (default is None) != (param.default is inspect.Parameter.empty):
                problems.append(f"{name}: {param.name} is documented "
                                f"{'without' if default is None else 'with'} a default, "
                                f"{'has' if param.default is not inspect.Parameter.empty else 'has none'}")
            elif default is not None and not _same_default(default, param.default):
                problems.append(f"{name}: {param.name} documented default {ast.unparse(default)}, "
                                f"is {param.default!r}")
    assert not problems, f"{block.id}: signatures that differ from the code:\n" + "\n".join(problems)


# --- The mechanism itself. ---

def test_every_python_block_is_accounted_for():
    """Each Python block either runs, is checked as signatures, or is skipped with a reason; and the
    docs hold Python blocks at all (the fence pattern is not broken)."""
    assert len(BLOCKS) >= 40, len(BLOCKS)
    for block in BLOCKS:
        assert block.skip is None or block.skip.strip(), block.id


def test_directives_bind_to_the_block_below(tmp_path):
    page = tmp_path / "page.md"
    text = """# A page

<!-- docs-test: page-setup
x = 1
-->

```python
y = x + 1
```

<!-- docs-test: continue -->
<!-- docs-test: check
assert y == 2
-->
```python
y += 0
```

<!-- docs-test: skip (needs a GPU) -->
```python
torch.zeros(1, device="cuda")
```

```bash
echo not python
```
"""
    parsed = parse_page(page, text)
    assert len(parsed.setup) == 1 and "x = 1" in parsed.setup[0]
    first, second, third = parsed.blocks
    assert (first.continues, second.continues, third.skip) == (False, True, "needs a GPU")
    assert second.checks and "assert y == 2" in second.checks[0]
    # The code keeps the page's line numbers: a traceback names the line in the page.
    assert first.code.splitlines()[first.line] == "y = x + 1"


@pytest.mark.parametrize("text, message", [
    ("<!-- docs-test: skip -->\n```python\npass\n```\n", "reason"),
    ("<!-- docs-test: setup\nx = 1\n-->\n\nSome prose.\n\n```python\npass\n```\n", "not followed by a code block"),
    ("<!-- docs-test: run-fast -->\n```python\npass\n```\n", "unknown docs-test directive"),
    ("<!-- docs-test: continue -->\n```python\npass\n```\n", "previous Python block"),
    ("<!-- docs-test: skip (GPU) -->\n```bash\nls\n```\n", "above a bash block"),
], ids=["skip-without-reason", "stray", "unknown", "continue-first", "above-bash"])
def test_directive_mistakes_are_errors(tmp_path, text, message):
    with pytest.raises(DirectiveError, match=message):
        parse_page(tmp_path / "page.md", text)


def test_signature_check_catches_a_wrong_default():
    block = Block(ROOT / "README.md", 0, "")
    namespace = {}
    exec("def f(a, b=2, *, c=None, **rest): pass", namespace)
    _check_signatures(block, "f(a, b=2, *, c=None, **rest)", namespace)
    for wrong in ("f(a, b=3, *, c=None, **rest)", "f(a, b=2, c=None, **rest)", "f(a, b=2, *, c=None)"):
        with pytest.raises(AssertionError, match="signatures that differ"):
            _check_signatures(block, wrong, namespace)
