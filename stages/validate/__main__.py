from pipeline.stage import main
from stages.validate import run

main(run, "validate")
