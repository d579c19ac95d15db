from pipeline.stage import main
from stages.evaluate import run

main(run, "evaluate")
