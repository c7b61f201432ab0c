-- τ²-bench's telecom DBs as tables: the carrier's `TelecomDB` (plans, customers, lines, bills,
-- devices) and the user's `TelecomUserDB` (the phone, `device`, and `surroundings`).
--
-- One column per field of τ²'s model, in model order, so a row reads back as the record τ²
-- dumps: nested values (an address, a bill's line items, the phone's apps) are JSON text, dates
-- are τ²'s `str()` of them ("2025-02-25", "2025-01-15 10:30:00"), and `position` keeps τ²'s list
-- order (TOML order; a new bill is appended). Numeric columns declare no type on purpose: τ²
-- stores what it is given (`set_data_usage(..., 15)` keeps an int), and an affinity would change
-- what it dumps and hashes.

CREATE TABLE plans (
    plan_id TEXT PRIMARY KEY,
    position INTEGER NOT NULL UNIQUE CHECK (position >= 0),
    name TEXT NOT NULL,
    data_limit_gb NOT NULL,
    price_per_month NOT NULL,
    data_refueling_price_per_gb NOT NULL
);

CREATE TABLE customers (
    customer_id TEXT PRIMARY KEY,
    position INTEGER NOT NULL UNIQUE CHECK (position >= 0),
    full_name TEXT NOT NULL,
    date_of_birth TEXT NOT NULL,
    email TEXT NOT NULL,
    phone_number TEXT NOT NULL,
    address TEXT NOT NULL CHECK (json_valid(address)),
    account_status TEXT NOT NULL,
    payment_methods TEXT NOT NULL CHECK (json_valid(payment_methods)),
    line_ids TEXT NOT NULL CHECK (json_valid(line_ids)),
    bill_ids TEXT NOT NULL CHECK (json_valid(bill_ids)),
    created_at TEXT NOT NULL,
    last_extension_date TEXT,
    goodwill_credit_used_this_year NOT NULL
);

CREATE TABLE lines (
    line_id TEXT PRIMARY KEY,
    position INTEGER NOT NULL UNIQUE CHECK (position >= 0),
    phone_number TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('Active', 'Suspended', 'Pending Activation', 'Closed')),
    plan_id TEXT NOT NULL,
    device_id TEXT,
    data_used_gb NOT NULL,
    data_refueling_gb NOT NULL,
    roaming_enabled INTEGER NOT NULL CHECK (roaming_enabled IN (0, 1)),
    contract_end_date TEXT,
    last_plan_change_date TEXT,
    last_sim_replacement_date TEXT,
    suspension_start_date TEXT
);

CREATE TABLE bills (
    bill_id TEXT PRIMARY KEY,
    position INTEGER NOT NULL UNIQUE CHECK (position >= 0),
    customer_id TEXT NOT NULL,
    period_start TEXT NOT NULL,
    period_end TEXT NOT NULL,
    issue_date TEXT NOT NULL,
    total_due NOT NULL,
    due_date TEXT NOT NULL,
    line_items TEXT NOT NULL CHECK (json_valid(line_items)),
    status TEXT NOT NULL CHECK (status IN ('Draft', 'Issued', 'Awaiting Payment', 'Paid', 'Overdue', 'Disputed'))
);

CREATE TABLE devices (
    device_id TEXT PRIMARY KEY,
    position INTEGER NOT NULL UNIQUE CHECK (position >= 0),
    device_type TEXT NOT NULL,
    model TEXT NOT NULL,
    imei TEXT,
    is_esim_capable INTEGER NOT NULL CHECK (is_esim_capable IN (0, 1)),
    activated INTEGER NOT NULL CHECK (activated IN (0, 1)),
    activation_date TEXT,
    last_esim_transfer_date TEXT
);

-- The user's phone (τ²'s MockPhoneAttributes): one row.
CREATE TABLE device (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    sim_card_status TEXT NOT NULL,
    sim_card_missing INTEGER NOT NULL,
    airplane_mode INTEGER NOT NULL,
    network_signal_strength TEXT NOT NULL,
    network_technology_connected TEXT NOT NULL,
    network_connection_status TEXT NOT NULL,
    battery_level NOT NULL,
    data_enabled INTEGER NOT NULL,
    roaming_enabled INTEGER NOT NULL,
    network_mode_preference TEXT,
    active_apn_settings TEXT NOT NULL CHECK (json_valid(active_apn_settings)),
    wifi_enabled INTEGER NOT NULL,
    wifi_connected INTEGER NOT NULL,
    wifi_ssid TEXT,
    wifi_signal_strength TEXT NOT NULL,
    wifi_calling_enabled INTEGER NOT NULL,
    wifi_calling_mms_over_wifi,
    data_saver_mode INTEGER NOT NULL,
    vpn_enabled_setting INTEGER NOT NULL,
    vpn_connected INTEGER NOT NULL,
    vpn_details TEXT CHECK (vpn_details IS NULL OR json_valid(vpn_details)),
    app_statuses TEXT NOT NULL CHECK (json_valid(app_statuses))
);

-- Where the user is (τ²'s UserSurroundings): one row. `sync_tools` keeps `roaming_allowed`,
-- `mobile_data_usage_exceeded`, `line_active` and `payment_request` in step with the carrier's DB.
CREATE TABLE surroundings (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    name,
    phone_number,
    is_abroad,
    roaming_allowed INTEGER NOT NULL,
    signal_strength TEXT NOT NULL CHECK (json_valid(signal_strength)),
    mobile_data_usage_exceeded INTEGER NOT NULL,
    line_active INTEGER NOT NULL,
    payment_request TEXT CHECK (payment_request IS NULL OR json_valid(payment_request))
);

-- τ²'s `TelecomUserTools.default_vpn_details`, the VPN `connect_vpn` connects to. τ² shares one
-- object for it across the class, which the initialization `break_vpn` degrades; here it is
-- per episode (what a fresh τ² process per evaluation gives), and not part of τ²'s user DB.
CREATE TABLE phone_defaults (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    vpn_server_performance TEXT NOT NULL
);
