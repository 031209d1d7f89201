"""For the diagnostic scripts that swap a modules handle's hooks step by step: a stand-in that the
module hooks enter like saved-tensor hooks, but that installs none (plain training plus the module
hooks' own cost)."""
import types


class NoSaveHooks:
    filter = types.SimpleNamespace(reset_record=lambda: None)  # what the model's pre-hook resets

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False
