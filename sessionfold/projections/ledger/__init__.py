"""The rule ledger: Longhaul's compaction pass as a projection (seeds/002, docs/ledger.md).

Modules: `fold` (events into the Store), `state` (keys, head, snapshot), `commands` (bash and
file calls, exit codes), `values` (values a later turn may need, read from command output),
`text` (message text, sanitizer), `heuristics` (reading standing rules and withdrawals),
`rules` (the lift check), `answer` (the model answer's schema), `context` (what a pass knows,
and its chunks), `verify` (code's checks of an answer), `model` (the DiffModel port and the
offline model), `prompt`, `pass_` (one pass), `turns` (turns mode), `render` (the summary),
`driver` (the embedded synchronous loop), `facts`.
"""
