"""Test tiers, chosen with `-m`: the table that gives each test its tier, applied by conftest.py.

- `unit`: starts no process (no rank, kernel, interpreter or torchrun): `python -m pytest -q -m unit`.
  Enforced: when only unit tests are selected, a unit test that starts a process fails, naming this table.
- `ranks`: starts processes: ranks, kernels, torchrun, fresh interpreters.
- `notebooks`: runs a lesson notebook top to bottom in a real kernel.
- `browser`: drives JupyterLab in Chromium (their modules carry the marker themselves).
- `slow`: over about 8 s on a loaded 2-core machine, in any tier (every notebook and browser test).

The table was measured, not guessed: the suite ran with every process start refused, and each test
that tried one is `ranks`. A module not in the table is `ranks` until someone adds it: a new unit
test costs the fast tier nothing until it is listed, and a wrongly listed one fails loudly.
Test files stay where they are (tiers are markers, not folders).
"""
from __future__ import annotations

TIERS = ("unit", "ranks", "notebooks", "browser")

# module: (its tier, the test functions in it that belong to the other of unit/ranks)
MODULES: dict[str, tuple[str, set[str]]] = {
    "test_attach.py": ("ranks", set()),
    "test_attach_hostile.py": ("unit", {
        "test_silent_connections_do_not_keep_real_ranks_out",
        "test_a_flood_from_another_host_never_evicts_a_ranks_handshake",
        "test_a_flood_on_the_same_host_does_not_keep_torchrun_ranks_out",
    }),
    "test_attach_security.py": ("unit", {
        "test_an_extra_attacher_and_a_duplicate_rank_are_refused_with_the_reason",
        "test_key_files_are_created_0600_and_readable_ones_are_refused",
    }),
    "test_bench_imports.py": ("unit", set()),
    "test_bench_smoke.py": ("ranks", set()),
    "test_benchmark_allreduce_by_hand.py": ("unit", {"test_hand_written_allreduce_equals_dist"}),
    "test_benchmark_memmap.py": ("ranks", {"test_refusals",
                                           "test_the_page_cache_share_before_each_epoch_reads_as_percent_per_epoch"}),
    "test_calibrate.py": ("ranks", {"test_fit_recovers_a_known_rate_and_intercept"}),
    "test_choices.py": ("unit", set()),
    "test_cluster.py": ("ranks", {
        "test_threads_per_rank_respect_an_explicit_omp_num_threads",
        "test_usable_cpus_honour_the_cgroup_quota",
    }),
    "test_collective_benchmark.py": ("ranks", {"test_busbw_formulas_on_known_numbers"}),
    "test_doc_snippets.py": ("unit", {
        "test_notebook_snippets_run_cell_after_cell_in_a_kernel",
        "test_python_snippet_runs",
    }),
    "test_dtensor_ledger.py": ("ranks", {"test_a_wrongly_called_functional_collective_is_in_the_ledger_with_torchs_error"}),
    "test_experiment_config.py": ("unit", {"test_package_import_stays_light"}),
    "test_experiments_on_a_cluster.py": ("ranks", set()),
    "test_export.py": ("ranks", set()),
    "test_export_pushed.py": ("unit", set()),
    "test_faults_collectives.py": ("ranks", {"test_one_rank_skips_the_preflight_round_trip",
                                             "test_where_names_collectives_a_run_issued_outside_the_cells",
                                             "test_the_ledger_reads_a_collectives_arguments_as_inspect_binds_them"}),
    "test_faults_death.py": ("ranks", set()),
    "test_faults_diagnose.py": ("unit", set()),
    "test_faults_engine_bounds.py": ("ranks", {"test_line_splitter_bounds_partial_lines_and_what_it_keeps"}),
    "test_faults_errors.py": ("ranks", {"test_a_long_message_is_said_once_not_again_at_the_traceback_end",
                                         "test_a_collective_torch_refuses_shows_the_cell_then_torch_not_the_kits_wrapper"}),
    "test_faults_input.py": ("unit", {"test_cluster_call_arguments_are_checked_before_sending"}),
    "test_faults_interrupt.py": ("ranks", {
        "test_the_group_recreated_after_the_kit_closed_connections_says_so_whatever_the_waiting_rank_raised",
        "test_an_interrupt_before_the_sending_thread_runs_ends_the_send_at_once",
    }),
    "test_faults_kernel.py": ("ranks", {"test_a_process_inside_execve_is_told_apart_from_a_kernel_thread"}),
    "test_faults_labels_signals.py": ("ranks", {"test_the_request_loop_is_shielded_from_sigint"}),
    "test_faults_notebook.py": ("ranks", set()),
    "test_faults_output.py": ("ranks", set()),
    "test_faults_rank_state.py": ("ranks", {
        "test_a_reply_that_cannot_be_pickled_is_stripped_to_text",
        "test_looks_like_pg_failure_ignores_store_errors_and_broken_str",
    }),
    "test_faults_soak.py": ("ranks", set()),
    "test_faults_startup.py": ("ranks", set()),
    "test_first_minutes.py": ("unit", {"test_demo_says_what_to_do_next_and_each_step_exists"}),
    "test_gpu.py": ("ranks", set()),
    "test_gpu_check.py": ("ranks", set()),
    "test_harness_exit.py": ("ranks", set()),
    "test_kernel_util.py": ("ranks", set()),
    "test_layering.py": ("unit", {
        "test_import_kit_is_cheap",
        "test_no_lazy_export_is_hidden_by_a_submodule_of_the_same_name",
        "test_the_kernel_never_imports_torch_to_run_cells_or_experiments",
    }),
    "test_lessons.py": ("unit", {"test_notebooks_are_built_from_their_sources"}),
    "test_lifecycle.py": ("ranks", set()),
    "test_local_time.py": ("unit", set()),
    "test_magics.py": ("ranks", set()),
    "test_measure_timing_clocks_links.py": ("unit", {
        "test_clock_offset_estimate_brackets_zero_on_one_host",
        "test_peak_is_reset_at_the_start_of_every_run",
        "test_pipeline_bubble_against_the_formula",
        "test_pipeline_timeline_plot_lines_ranks_up_and_shows_the_formula",
        "test_ranks_share_one_clock_and_sends_precede_receives",
        "test_uninstrumented_ddp_counts_its_bucket_copy",
    }),
    "test_one_copy.py": ("unit", set()),
    "test_output_flood.py": ("unit", {"test_a_million_lines_per_rank_reach_nbclient_complete_with_every_ranks_tail"}),
    "test_overlap.py": ("unit", set()),
    "test_parallel_memory.py": ("unit", {
        "test_ep_activations_from_routing_and_balanced",
        "test_memory_by_kind_equals_the_formula",
        "test_memory_plot_draws_these_runs_beside_the_formula",
        "test_the_formula_is_what_the_theory_says_for_the_run",
    }),
    "test_parallel_mistakes.py": ("ranks", {
        "test_a_function_the_kernel_called_still_finishing_after_the_interrupt_is_not_said_to_catch_it",
        "test_ranks_blocked_in_collectives_that_cannot_match_are_named_on_interrupt",
        "test_the_ranks_are_asked_where_they_wait_only_when_all_sit_idle_and_seldom",
        "test_nccl_ranks_are_never_asked_where_they_wait_while_they_sit_idle",
        "test_a_rank_waiting_on_a_rank_the_release_freed_is_released_too",
    }),
    "test_parallel_run_records.py": ("ranks", {
        "test_bad_splits_refused_with_the_fix",
        "test_config_knows_the_gpt_shapes",
        "test_the_config_refuses_splits_by_the_shapes_the_ranks_build",
    }),
    "test_parallel_user_errors.py": ("unit", set()),
    "test_parallelisms.py": ("ranks", {"test_fsdp_tp_check_silences_only_torchs_two_notices",
                                       "test_ring_attention_milliseconds_leave_out_the_first_calls_costs"}),
    "test_pipeline_interleaved.py": ("unit", {
        "test_pipeline_bubble_bench_runs_the_interleaved_order_and_says_its_formula",
        "test_record_carries_the_bubble_beside_the_interleaved_formula",
        "test_two_ranks_interleaved_equal_one_process_after_steps",
    }),
    "test_plan.py": ("unit", {
        "test_planning_never_imports_torch",
        "test_state_bytes_match_the_measured_sharding_runs",
    }),
    "test_plan_interleaved.py": ("unit", set()),
    "test_plan_panel_local.py": ("unit", {
        "test_real_check_draws_measured_beside_predicted_and_stops_between_repeats"}),
    "test_plan_parallel.py": ("ranks", set()),
    "test_plan_published.py": ("unit", set()),
    "test_plots.py": ("unit", {"test_import_is_cheap"}),
    "test_plots_compression.py": ("unit", set()),
    "test_plots_notes.py": ("unit", set()),
    "test_plots_parallel_load.py": ("ranks", {"test_records_without_the_data_say_what_to_run",
                                              "test_counts_get_integer_ticks"}),
    "test_predict.py": ("unit", {
        "test_prediction_modules_stay_torch_free",
        "test_validation_point_on_two_gloo_ranks",
    }),
    "test_predict_mesh.py": ("unit", set()),
    "test_public_surface.py": ("unit", {
        "test_completing_a_lazy_package_imports_no_torch",
        "test_ipython_completes_the_keywords_a_factory_passes_on",
        "test_ipython_tab_completion_offers_the_lazy_names",
        "test_subpackages_are_reachable_from_import_kit",
    }),
    "test_pull_interrupt.py": ("unit", set()),
    "test_pull_missing.py": ("unit", set()),
    "test_push_interrupt.py": ("unit", set()),
    "test_rank_connect.py": ("unit", set()),
    "test_rank_requests.py": ("unit", set()),
    "test_readme.py": ("unit", set()),
    "test_records_of_sharding_and_param_server.py": ("ranks", set()),
    "test_records_report.py": ("unit", set()),
    "test_renamed.py": ("unit", set()),
    "test_run_record_display.py": ("unit", set()),
    "test_run_record.py": ("ranks", {"test_saved_tensor_hooks_count_activations_exactly"}),
    "test_security.py": ("ranks", {
        "test_tampered_payload_is_rejected_before_unpickling",
        "test_wrong_key_and_replay_are_rejected",
    }),
    "test_stats_and_verdicts.py": ("unit", set()),
    "test_stop.py": ("unit", {"test_stop_reaches_attached_ranks_that_cannot_see_the_kernels_files"}),
    "test_strategy_accelerate.py": ("ranks", {
        "test_already_sharded_loader_refused",
        "test_impossible_combinations_refused",
        "test_refused_before_the_ranks_start",
    }),
    "test_strategy_matches_single_process.py": ("unit", {"test_strategy_matches_single_process"}),
    "test_strategy_mesh.py": ("ranks", {
        "test_bad_meshes_refused_with_the_fix",
        "test_lab_bench_offers_the_meshes_and_sets_their_world_size",
    }),
    "test_strategy_param_server.py": ("ranks", {"test_param_server_refusals"}),
    "test_strategy_sharding_and_compression.py": ("unit", {
        "test_fp16_compression_close_to_ddp",
        "test_fsdp_bytes_counted_equal_the_prediction",
        "test_parameters_match_single_process",
        "test_powersgd_compresses_after_warmup",
        "test_sharded_equal_ddp",
    }),
    "test_template.py": ("ranks", {
        "test_forked_ranks_use_cuda_and_nccl",
        "test_the_no_template_flag_and_its_config_field",
    }),
    "test_template_random.py": ("unit", {
        "test_every_rank_and_every_start_draws_its_own_numbers",
        "test_a_stopped_template_does_not_hang_the_start",
    }),
    "test_trace.py": ("ranks", {
        "test_a_profile_of_fewer_ranks_leaves_no_rank_file_of_the_earlier_one",
        "test_partial_overlaps_move_to_an_extra_row",
        "test_profile_path_that_is_a_file_or_has_no_parent_says_what_to_name",
        "test_ranks_on_two_hosts_use_the_measured_offset_or_say_they_could_not",
        "test_write_replaces_a_regular_file_never_a_symlink",
    }),
    "test_transfer_transactions.py": ("ranks", set()),
    "test_watch_interrupts.py": ("unit", set()),
    "test_wire.py": ("unit", set()),
    "test_wire_fsdp_strategy.py": ("unit", set()),
    "test_whole_frames.py": ("unit", set()),
    "test_ways_in.py": ("unit", {
        "test_the_readme_command_keeps_a_modules_tests_on_one_worker",
        "test_a_notebook_saved_with_outputs_still_counts_as_built_from_its_source",
    }),
    "test_workloads.py": ("unit", set()),
    "test_widgets.py": ("unit", {"test_real_run_fills_table_and_plot", "test_real_stop_mid_sweep"}),
}

NOTEBOOKS = {"test_lessons.py::test_lesson_runs_top_to_bottom",
             "test_lessons.py::test_a_rank_killed_for_memory_is_reported_as_out_of_memory"}
BROWSER_MODULES = {"test_browser.py", "test_browser_flood.py", "test_browser_lessons.py"}

# Unit tests over about 8 s under a load of 12 on 2 cores (matplotlib drawing every plot family).
SLOW = {
    "test_first_minutes.py::test_lab_bench_suggests_only_sweep_values_the_configuration_accepts",
    "test_local_time.py::test_gpt_spec_matches_the_workload_module",
    "test_plan_published.py::test_zero3_collapses_as_gpus_grow_at_a_fixed_batch_and_ptd_p_does_not",
    "test_plan.py::test_plot_and_panel_show_the_plan",
    "test_plan_panel_local.py::test_real_check_draws_measured_beside_predicted_and_stops_between_repeats",
    "test_plots.py::test_no_plot_family_overlaps_or_cuts_off_its_text",
    "test_predict.py::test_prediction_panel_redraws_on_every_choice",
    "test_stop.py::test_stop_reaches_attached_ranks_that_cannot_see_the_kernels_files",
    "test_widgets.py::test_every_plot_choice_draws_from_bench_runs",
    "test_widgets.py::test_save_clear_load_roundtrip",
    "test_widgets.py::test_sweep_runs_each_value_and_plots_against_knob",
}


def tier_of(module: str, function: str) -> str:
    """The tier of test `function` (without its parameters) in test file `module` (its base name)."""
    if module in BROWSER_MODULES:
        return "browser"
    if f"{module}::{function}" in NOTEBOOKS:
        return "notebooks"
    tier, others = MODULES.get(module, ("ranks", set()))
    if function in others:
        return "ranks" if tier == "unit" else "unit"
    return tier


def is_slow(module: str, function: str) -> bool:
    return f"{module}::{function}" in SLOW or tier_of(module, function) in ("notebooks", "browser")
