"""The functions a user query may call (DuckDB's names, lowercase): everything else is refused,
so a function a new DuckDB version adds stays refused until someone vets it and lists it here.

What is listed computes a value from its arguments (arithmetic, strings, lists, structs, maps,
dates, JSON, hashes, statistics), or reads the clock or draws a random number. What is not:
anything that reads files or the network, touches settings, variables, sequences or the log,
reveals the server (version, database, schema, user, query, connection, platform), sleeps,
parses or plans SQL given as text, or is DuckDB-internal (`__internal_*`, aggregate states,
collation helpers, geometry and variant functions, PostgreSQL compatibility stubs)."""


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Operators as DuckDB's parser names them (`a || b` calls the function `||`)
OPERATORS = _names("""
    !__postfix !~~ !~~* % & && * ** + - ->> / // <-> << <=> <@ >> @ @> ^ ^@ | || ~ ~~ ~~* ~~~
""")
# Scalar functions: numbers, strings, dates, lists, structs and maps, JSON values
NUMBERS = _names("""
    abs acos acosh add asin asinh atan atan2 atanh bit_count cbrt ceil ceiling cos cosh cot degrees
    divide equi_width_bins even exp factorial fdiv floor fmod gamma gcd gen_random_uuid greatest
    greatest_common_divisor isfinite isinf isnan lcm least least_common_multiple lgamma ln log
    log10 log2 mod multiply nextafter pi pow power radians random round round_even roundbankers
    sign signbit sin sinh sqrt subtract tan tanh trunc uuid uuid_extract_timestamp
    uuid_extract_version uuidv4 uuidv7 xor
""")
# Strings, bytes and bits
STRINGS = _names("""
    ascii bar base64 bin bit_length bit_position bitstring char_length character_length chr concat
    concat_ws contains damerau_levenshtein decode editdist3 encode ends_with error format
    format_bytes formatreadabledecimalsize formatreadablesize from_base64 from_binary from_hex
    get_bit hamming hash hex if ilike_escape instr jaccard jaro_similarity jaro_winkler_similarity
    lcase left left_grapheme len length length_grapheme levenshtein like_escape lower lpad ltrim
    md5 md5_number mismatches nfc_normalize not_ilike_escape not_like_escape nullif octet_length
    ord overlay parse_formatted_bytes position prefix printf regexp_escape regexp_extract
    regexp_extract_all regexp_full_match regexp_matches regexp_replace regexp_split_to_array repeat
    replace reverse right right_grapheme rpad rtrim set_bit sha1 sha256 split split_part
    starts_with str_split str_split_regex string_split string_split_regex string_to_array
    strip_accents strlen strpos substr substring substring_grapheme suffix to_base to_base64
    to_binary to_hex translate trim typeof ucase unbin unhex unicode upper url_decode url_encode
""")
# Dates, times and intervals (the clock included)
DATES = _names("""
    age ago century current_date current_localtime current_localtimestamp date_add date_diff
    date_part date_sub date_trunc datediff datepart datesub datetrunc day dayname dayofmonth
    dayofweek dayofyear days_in_month decade epoch epoch_ms epoch_ns epoch_us era get_current_time
    get_current_timestamp hour isodow isoyear julian last_day make_date make_time make_timestamp
    make_timestamp_ms make_timestamp_ns make_timestamptz microsecond millennium millisecond minute
    month monthname nanosecond normalized_interval now quarter second strftime strptime time_bucket
    timezone timezone_hour timezone_minute to_centuries to_days to_decades to_hours to_microseconds
    to_millennia to_milliseconds to_minutes to_months to_quarters to_seconds to_timestamp to_weeks
    to_years today transaction_timestamp try_strptime week weekday weekofyear year yearweek
""")
# Lists and arrays (list_aggr's aggregate is checked against AGGREGATE, see the guard)
LISTS = _names("""
    aggregate apply array_aggr array_aggregate array_append array_apply array_cat array_concat
    array_contains array_cosine_distance array_cosine_similarity array_cross_product array_distance
    array_distinct array_dot_product array_extract array_filter array_grade_up array_has
    array_has_all array_has_any array_indexof array_inner_product array_intersect array_length
    array_negative_dot_product array_negative_inner_product array_pop_back array_pop_front
    array_position array_prepend array_push_back array_push_front array_reduce array_resize
    array_reverse array_reverse_sort array_select array_slice array_sort array_to_string
    array_transform array_unique array_value array_where array_zip cardinality element_at filter
    flatten generate_series generate_subscripts grade_up list_aggr list_aggregate list_any_value
    list_append list_apply list_approx_count_distinct list_avg list_bit_and list_bit_or
    list_bit_xor list_bool_and list_bool_or list_cat list_concat list_contains list_cosine_distance
    list_cosine_similarity list_count list_distance list_distinct list_dot_product list_element
    list_entropy list_extract list_filter list_first list_grade_up list_has list_has_all
    list_has_any list_histogram list_indexof list_inner_product list_intersect list_kurtosis
    list_kurtosis_pop list_last list_mad list_max list_median list_min list_mode
    list_negative_dot_product list_negative_inner_product list_pack list_position list_prepend
    list_product list_reduce list_resize list_reverse list_reverse_sort list_select list_sem
    list_skewness list_slice list_sort list_stddev_pop list_stddev_samp list_string_agg list_sum
    list_transform list_unique list_value list_var_pop list_var_samp list_where list_zip range
    reduce unnest
""")
# Structs, maps and rows
STRUCTS = _names("""
    map map_concat map_contains map_contains_entry map_contains_value map_entries map_extract
    map_extract_value map_from_entries map_keys map_values row struct_concat struct_contains
    struct_extract struct_extract_at struct_has struct_indexof struct_insert struct_keys
    struct_pack struct_position struct_update struct_values
""")
# JSON values (not json_serialize_sql and its kin: they read SQL text)
JSON = _names("""
    array_to_json from_json from_json_strict json json_array json_array_length json_contains
    json_exists json_extract json_extract_path json_extract_path_text json_extract_string json_keys
    json_merge_patch json_object json_pretty json_quote json_structure json_transform
    json_transform_strict json_type json_valid json_value row_to_json to_json
""")

SCALAR = NUMBERS | STRINGS | DATES | LISTS | STRUCTS | JSON

AGGREGATE = _names("""
    any_value approx_count_distinct approx_quantile approx_top_k arbitrary arg_max arg_max_null
    arg_max_nulls_last arg_min arg_min_null arg_min_nulls_last argmax argmin array_agg avg bit_and
    bit_or bit_xor bool_and bool_or corr count count_if count_star countif covar_pop covar_samp
    entropy favg first fsum geomean geometric_mean group_concat histogram histogram_exact
    json_group_array json_group_object json_group_structure kahan_sum kurtosis kurtosis_pop last
    list listagg mad max max_by mean median min min_by mode product quantile quantile_cont
    quantile_disc regr_avgx regr_avgy regr_count regr_intercept regr_r2 regr_slope regr_sxx
    regr_sxy regr_syy reservoir_quantile sem skewness stddev stddev_pop stddev_samp string_agg sum
    sumkahan var_pop var_samp variance wavg weighted_avg
""")

WINDOW = _names("""
    cume_dist dense_rank first_value lag last_value lead nth_value ntile percent_rank rank
    rank_dense row_number
""")

# Functions that take an aggregate's name as a string: that name must be in AGGREGATE.
BY_AGGREGATE_NAME = frozenset({"aggregate", "array_aggr", "array_aggregate", "list_aggr",
                               "list_aggregate"})

# Table functions allowed in FROM besides the catalog's tables and views.
TABLE = frozenset({"range", "generate_series", "unnest"})

ALLOWED = OPERATORS | SCALAR | AGGREGATE | WINDOW

# Names DuckDB's binder turns into a call when no column has them (`SELECT current_user` calls
# current_user()): the parse shows a column, so the guard checks the function it maps to.
KEYWORD_CALLS = {
    "current_catalog": "current_catalog", "current_date": "current_date",
    "current_role": "current_role", "current_schema": "current_schema",
    "current_time": "get_current_time", "current_timestamp": "get_current_timestamp",
    "current_user": "current_user", "localtime": "current_localtime",
    "localtimestamp": "current_localtimestamp", "session_user": "session_user", "user": "user",
}
