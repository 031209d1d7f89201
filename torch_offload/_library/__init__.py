"""The compiled library as the Python package sees it (the engine itself is C++: csrc/): loading
the library and the C save hooks (loading.py), the ops' fake kernels and Python wrappers (ops.py), OffloadManager construction, the
default manager and merged statistics (manager.py), and what every layer above shares: how a save of
any layout is copied compact and rebuilt (layouts.py), DTensor shards (dtensors.py), host budgets
shared by the ranks of a node (node_budget.py), our ops outside the user's dispatch modes
(dispatch_modes.py)."""
