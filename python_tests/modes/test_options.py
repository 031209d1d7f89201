"""apply()'s options, in the user's terms: errors that name apply() and the argument written (an
option of another mode, a misspelt mode=, a likely meant option), and a ready manager together with
the options that would build one."""
import pytest

import torch_offload
from python_tests.support.llama import _tiny_llama, _train_step


def test_min_bytes_in_hidden_states_mode_names_apply_and_the_argument():
    with pytest.raises(TypeError, match=r"apply\(mode='hidden_states'\) got an unexpected keyword "
                                        r"argument 'min_bytes' \(mode='hidden_states' offloads each "
                                        r"block's input whatever its size") as error:
        torch_offload.apply(_tiny_llama("cpu"), mode="hidden_states", min_bytes=0)
    assert "OffloadManager" not in str(error.value)


def test_unknown_keyword_names_apply_and_suggests_blocks():
    model = _tiny_llama("cpu")
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'layers' \(the blocks to wrap "
                                        r"are blocks=\[\.\.\.\]"):
        torch_offload.apply(model, layers=list(model.model.layers))
    with pytest.raises(TypeError, match=r"apply\(mode='all'\) got an unexpected keyword argument "
                                        r"'prefetch' \(did you mean prefetch_depth=\?\); mode='all' takes: "
                                        r"min_bytes, max_in_flight"):
        torch_offload.apply(model, "all", prefetch=2)
    # A misspelt mode= names what the user wrote and the mode apply() used for want of it.
    with pytest.raises(TypeError, match=r"^torch_offload.apply\(\) got an unexpected keyword argument 'mdoe' "
                                        r"\(did you mean mode=\?\); mode='hidden_states' \(the default\) "
                                        r"takes: disk_only, use_reentrant, max_in_flight") as error:
        torch_offload.apply(model, mdoe="all")
    for internal in ("synchronous", "release_sources_on_save"):  # the manager's, not apply()'s
        assert internal not in str(error.value)
    # An option of another mode says which mode takes it.
    with pytest.raises(TypeError, match=r"'policy' \(policy is for mode='selective'\)"):
        torch_offload.apply(model, "hidden_states", policy="attention")
    with pytest.raises(TypeError, match=r"apply\(mode=None\) got an unexpected keyword argument 'min_bytes'"):
        torch_offload.apply(model, None, layer_offloading=True, min_bytes=0)
    # A failed apply() leaves the model as it was: a later apply() works.
    assert "forward" not in model.model.layers[0].__dict__
    torch_offload.apply(model, "all", min_bytes=0)


def test_manager_with_activation_options():
    model = _tiny_llama("cpu")
    manager = torch_offload.OffloadManager()
    with pytest.raises(ValueError, match=r"either manager= or the options that build one \(max_in_flight\)"):
        torch_offload.apply(model, "all", manager=manager, max_in_flight=2)
    # min_bytes is a hook option, not a manager option: allowed with a ready manager.
    handle = torch_offload.apply(model, "all", manager=manager, min_bytes=0)
    _train_step(model)
    assert handle.manager is manager and manager.stats()["saves"] > 0
