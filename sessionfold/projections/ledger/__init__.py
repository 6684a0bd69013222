"""The rule ledger's pure folds: Longhaul's ledger as a projection (seeds/002, docs/ledger.md).

Modules: `fold` (events into the Store), `state` (keys, head, snapshot), `commands` (bash and
file calls, exit codes), `values` (values a later turn may need, read from command output),
`text` (message text, sanitizer), `heuristics` (reading standing rules and withdrawals),
`rules` (the lift check), `render` (the summary), `view` (the ledger's document), `facts`,
`pass_rows` (a pass result's rows and state update, shared with the pass). Private to it:
`records` (the stored rows' types). The model-calling compaction pass is in
`sessionfold.ports.ledger`.
"""

__all__ = [
    "commands",
    "config",
    "facts",
    "fold",
    "heuristics",
    "hook",
    "pass_rows",
    "render",
    "rules",
    "state",
    "text",
    "values",
    "view",
]
