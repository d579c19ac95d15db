"""`python -m stages.export`: the stage under params.yaml."""

from pipeline.stage import main
from stages.export import run

main(run, "export")
