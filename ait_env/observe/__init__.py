"""What a run shows and keeps: the cost ledger and budgets (``ledger``), per-episode metrics (``metrics``),
charts (``plots``) and the terminal summary (``display``)."""
