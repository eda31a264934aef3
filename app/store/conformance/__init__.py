"""The one conformance check for update stores, shipped so a custom store can be checked too:
`check.check_update_store`. One module per method family holds its rules (`records`,
`claims`, `settles`, `exhaustions`, `control` with the operators' views, `events`, `polling`,
`access` for who may see what and the console's sessions); `_core` holds what they share.

The rules stand above the contract they check, not inside each family's package: a rule drives
several families at once (it records, claims and settles), through the levels
`app.store.contract` composes from the families' roles."""
