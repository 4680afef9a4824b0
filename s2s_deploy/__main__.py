from s2s_deploy.cli import main

main()
