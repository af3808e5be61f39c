"""The navigation step of the retrieval agent: its options (`options`), the SQL adapters the pure `navigation`
package walks with (`sql`), the step itself (`step`), and its evaluation on runbook questions (`eval_nav`)."""
