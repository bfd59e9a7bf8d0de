from evals.swebench import main

main()
