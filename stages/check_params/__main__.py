from pipeline.stage import main
from stages.check_params import run

main(run, "check_params")
