"""What a build runs with: toolchain, host facts, build environment, jobs model and makespan, build order, measuring, report, image."""
