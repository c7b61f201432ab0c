"""τ²-bench's telecom DBs (`db.toml`, `user_db.toml`) as the `tau2_telecom` env's seed rows, and back.

Telecom has two DBs, the carrier's (`TelecomDB`) and the user's phone (`TelecomUserDB`); the env
keeps both in its one state (`tau2_telecom/schema.sql`). The directions live together because they
must stay exact inverses: `telecom_state_to_tau2_db` and `telecom_state_to_tau2_user_db` are how a
run's end state is compared with τ²'s (its two hashes), so what `telecom_dbs_to_seed` flattens comes
back with the same values, key order and list order.

τ² loads the TOML files into pydantic models, which coerce them (an ISO datetime string becomes a
`datetime`, dumped with `str()` as "2025-01-20 14:30:00") and fill in defaults the files leave out
(`mms_proxy`, all of `surroundings`). The models below repeat τ²'s field types and defaults (not
their descriptions, which no tool shows), so the seed is exactly τ²'s `model_dump()`.
"""

from __future__ import annotations

import datetime
import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: τ²'s hashes of the pristine telecom DBs (`get_dict_hash(model_dump())`).
TELECOM_INITIAL_DB_HASH = "304cf5ef059852e117ea801ab9a5efc24c9713ec887679dc2e30acceb4b6742d"
TELECOM_INITIAL_USER_DB_HASH = "e1f3a8637388808221228ff3f87294444e6b64caf721f5eb243a85d0a9380b28"

#: The VPN τ²'s `connect_vpn` connects to, before anything degrades it.
DEFAULT_VPN_PERFORMANCE = "excellent"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Address(_Model):
    street: str
    city: str
    state: str
    zip_code: str


class Plan(_Model):
    plan_id: str
    name: str
    data_limit_gb: float
    price_per_month: float
    data_refueling_price_per_gb: float


class Device(_Model):
    device_id: str
    device_type: Literal["phone", "router", "tablet", "watch", "other"]
    model: str
    imei: str | None = None
    is_esim_capable: bool
    activated: bool = False
    activation_date: datetime.datetime | None = None
    last_esim_transfer_date: datetime.datetime | None = None


class Line(_Model):
    line_id: str
    phone_number: str
    status: Literal["Active", "Suspended", "Pending Activation", "Closed"] = "Pending Activation"
    plan_id: str
    device_id: str | None = None
    data_used_gb: float = 0.0
    data_refueling_gb: float = 0.0
    roaming_enabled: bool = False
    contract_end_date: datetime.date | None = None
    last_plan_change_date: datetime.date | None = None
    last_sim_replacement_date: datetime.date | None = None
    suspension_start_date: datetime.date | None = None


class LineItem(_Model):
    description: str
    amount: float
    date: datetime.date
    item_type: str


class Bill(_Model):
    bill_id: str
    customer_id: str
    period_start: datetime.date
    period_end: datetime.date
    issue_date: datetime.date
    total_due: float
    due_date: datetime.date
    line_items: list[LineItem] = Field(default_factory=list)
    status: Literal["Draft", "Issued", "Awaiting Payment", "Paid", "Overdue", "Disputed"] = "Draft"


class PaymentMethod(_Model):
    method_type: Literal["Credit Card", "Debit Card", "PayPal"]
    account_number_last_4: str
    expiration_date: str


class Customer(_Model):
    customer_id: str
    full_name: str
    date_of_birth: str
    email: str
    phone_number: str
    address: Address
    account_status: Literal["Active", "Suspended", "Pending Verification", "Closed"] = "Pending Verification"
    payment_methods: list[PaymentMethod] = Field(default_factory=list)
    line_ids: list[str] = Field(default_factory=list)
    bill_ids: list[str] = Field(default_factory=list)
    created_at: datetime.datetime = datetime.datetime(2025, 1, 1)
    last_extension_date: datetime.date | None = None
    goodwill_credit_used_this_year: float = 0.0


class TelecomDB(_Model):
    plans: list[Plan] = Field(default_factory=list)
    customers: list[Customer] = Field(default_factory=list)
    lines: list[Line] = Field(default_factory=list)
    bills: list[Bill] = Field(default_factory=list)
    devices: list[Device] = Field(default_factory=list)


Signal = Literal["none", "poor", "fair", "good", "excellent"]
Technology = Literal["none", "2G", "3G", "4G", "5G"]


class APNSettings(_Model):
    apn_name: Literal["internet", "broken"] = "internet"
    reset_at_reboot: bool = False
    mms_apn: str | None = "mms"
    mmsc_url: str | None = "http://mms.carrier.com/mms/wapenc"
    mms_proxy: str | None = None
    mms_port: int | None = None


class VpnDetails(_Model):
    server_address: str | None = None
    protocol: str | None = None
    server_performance: Literal["unknown", "poor", "fair", "good", "excellent"] = "unknown"


class AppPermissions(_Model):
    sms: bool = False
    storage: bool = False
    phone: bool = False
    network: bool = False


class AppStatus(_Model):
    app_name: str
    permissions: AppPermissions = Field(default_factory=AppPermissions)


def _default_apps() -> dict[str, AppStatus]:
    return {
        "messaging": AppStatus(
            app_name="messaging", permissions=AppPermissions(sms=True, storage=True, phone=True)
        ),
        "browser": AppStatus(app_name="browser", permissions=AppPermissions(network=True, storage=True)),
    }


class MockPhoneAttributes(_Model):
    sim_card_status: Literal["active", "missing", "locked_pin", "locked_puk"] = "active"
    sim_card_missing: bool = False
    airplane_mode: bool = False
    network_signal_strength: Signal = "good"
    network_technology_connected: Technology = "5G"
    network_connection_status: Literal["connected", "searching", "no_service", "emergency_only"] = "connected"
    battery_level: int = 80
    data_enabled: bool = True
    roaming_enabled: bool = False
    network_mode_preference: Literal["4g_5g_preferred", "4g_only", "3g_only", "2g_only"] = "4g_5g_preferred"
    active_apn_settings: APNSettings = Field(default_factory=APNSettings)
    wifi_enabled: bool = False
    wifi_connected: bool = False
    wifi_ssid: str | None = None
    wifi_signal_strength: Signal = "none"
    wifi_calling_enabled: bool = False
    wifi_calling_mms_over_wifi: bool = False
    data_saver_mode: bool = False
    vpn_enabled_setting: bool = False
    vpn_connected: bool = False
    vpn_details: VpnDetails | None = None
    app_statuses: dict[str, AppStatus] = Field(default_factory=_default_apps)


class PaymentRequest(_Model):
    bill_id: str
    amount_due: float
    paid: bool = False


def _default_signal() -> dict[Technology, Signal]:
    return {"2G": "poor", "3G": "fair", "4G": "good", "5G": "excellent"}


class UserSurroundings(_Model):
    name: str | None = None
    phone_number: str | None = None
    is_abroad: bool = False
    roaming_allowed: bool = False
    signal_strength: dict[Technology, Signal] = Field(default_factory=_default_signal)
    mobile_data_usage_exceeded: bool = False
    line_active: bool = True
    payment_request: PaymentRequest | None = None


class TelecomUserDB(_Model):
    device: MockPhoneAttributes = Field(default_factory=MockPhoneAttributes)
    surroundings: UserSurroundings = Field(default_factory=UserSurroundings)


#: The carrier's tables, in τ²'s `TelecomDB` order, with each record's fields in model order.
AGENT_TABLES: dict[str, tuple[str, ...]] = {
    "plans": tuple(Plan.model_fields),
    "customers": tuple(Customer.model_fields),
    "lines": tuple(Line.model_fields),
    "bills": tuple(Bill.model_fields),
    "devices": tuple(Device.model_fields),
}
#: The user's one-row tables (`TelecomUserDB`'s two parts), fields in model order.
USER_TABLES: dict[str, tuple[str, ...]] = {
    "device": tuple(MockPhoneAttributes.model_fields),
    "surroundings": tuple(UserSurroundings.model_fields),
}
#: Fields stored as JSON text (nested models, lists and dicts).
JSON_FIELDS = frozenset(
    {
        "address",
        "payment_methods",
        "line_ids",
        "bill_ids",
        "line_items",
        "active_apn_settings",
        "vpn_details",
        "app_statuses",
        "signal_strength",
        "payment_request",
    }
)
#: Boolean fields (SQLite gives them back as 0 and 1).
BOOL_FIELDS = frozenset(
    name
    for model in (Line, Device, MockPhoneAttributes, UserSurroundings)
    for name, info in model.model_fields.items()
    if info.annotation is bool
)
#: The one user-side table that is not part of τ²'s user DB (see schema.sql).
PHONE_DEFAULTS = "phone_defaults"
#: Tables in the order seed.json lists them.
TELECOM_SEED_TABLES = (*AGENT_TABLES, *USER_TABLES, PHONE_DEFAULTS)


def _dump(model: BaseModel) -> dict[str, Any]:
    """`model.model_dump()` as τ² hashes it: through `json.dumps(default=str)` and back."""
    dumped: dict[str, Any] = json.loads(json.dumps(model.model_dump(), default=str))
    return dumped


def load_telecom_toml(path: Path, model: type[BaseModel]) -> dict[str, Any]:
    """A TOML file of τ²'s as τ²'s model dumps it (coerced, defaults filled in)."""
    return _dump(model.model_validate(tomllib.loads(path.read_text(encoding="utf-8"))))


def _row(fields: tuple[str, ...], record: dict[str, Any]) -> dict[str, Any]:
    return {f: json.dumps(record[f]) if f in JSON_FIELDS else record[f] for f in fields}


def telecom_dbs_to_seed(db: dict[str, Any], user_db: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """τ²'s two DB dumps (`TelecomDB` and `TelecomUserDB`, as `load_telecom_toml` gives them) as
    seed rows for `tau2_telecom/schema.sql`."""
    seed: dict[str, list[dict[str, Any]]] = {}
    for table, fields in AGENT_TABLES.items():
        records = db[table]
        key = fields[0]
        ids = [r[key] for r in records]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{table}: duplicate {key} in {ids}")
        seed[table] = [{**_row(fields, r), "position": i} for i, r in enumerate(records)]
    for table, fields in USER_TABLES.items():
        seed[table] = [{"id": 1, **_row(fields, user_db[table])}]
    seed[PHONE_DEFAULTS] = [{"id": 1, "vpn_server_performance": DEFAULT_VPN_PERFORMANCE}]
    return seed


def _record(fields: tuple[str, ...], row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields:
        value = row[f]
        if f in JSON_FIELDS and value is not None:
            value = json.loads(value)
        elif f in BOOL_FIELDS and type(value) is int:
            value = bool(value)
        out[f] = value
    return out


def telecom_state_to_tau2_db(state: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The env's state as τ²'s `TelecomDB.model_dump()` (dates as τ²'s `str()`): what τ² hashes."""
    return {
        table: [_record(fields, r) for r in sorted(state[table], key=lambda r: r["position"])]
        for table, fields in AGENT_TABLES.items()
    }


def telecom_state_to_tau2_user_db(state: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The env's state as τ²'s `TelecomUserDB.model_dump()`: `{"device": …, "surroundings": …}`."""
    out = {}
    for table, fields in USER_TABLES.items():
        (row,) = state[table]
        out[table] = _record(fields, row)
    return out
