"""Exhaustions, kept until their exact acknowledgement, and the bulk actions over them:
`roles`, `statements`, `methods`. Its conformance rules: `app.store.conformance.exhaustions`."""
