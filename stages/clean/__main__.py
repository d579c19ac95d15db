from pipeline.stage import main
from stages.clean import run

main(run, "clean")
