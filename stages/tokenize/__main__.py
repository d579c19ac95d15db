from pipeline.stage import main
from stages.tokenize import run

main(run, "tokenize")
