"""The tools around the DAG: the `mtpipe` CLI, the Prefect flow and deployments, the plots page. Nothing in the
runtime or the stages imports them."""
