"""Tools of a community pharmacy. The clock is frozen at TODAY so the same calls give the same state."""

from __future__ import annotations

from typing import Any

from envforge.server import Db, ToolError, tool

TODAY = "2025-03-14"
PATIENT = "patient_id, name, birth_date, allergy"
DRUG = "drug_id, name, stock, price_cents, controlled"
RX = "rx_id, patient_id, drug_id, refills_left, status"
FILL = "fill_id, rx_id, quantity, filled_on, total_cents"


@tool
async def get_patient(db: Db, patient_id: str) -> dict[str, Any]:
    """Look up a patient by id.

    Args:
        patient_id: Patient id such as 'P-101'.
    """
    return await db.require_one(
        f"SELECT {PATIENT} FROM patients WHERE patient_id = ?", (patient_id,), "patient not found"
    )


@tool
async def get_drug(db: Db, drug_id: str) -> dict[str, Any]:
    """Get a drug with its stock and price.

    Args:
        drug_id: Drug id such as 'D-201'.
    """
    return await db.require_one(
        f"SELECT {DRUG} FROM drugs WHERE drug_id = ?", (drug_id,), f"drug {drug_id} not found"
    )


@tool
async def list_prescriptions(db: Db, patient_id: str) -> list[dict[str, Any]]:
    """A patient's prescriptions with refills left.

    Args:
        patient_id: The patient id.
    """
    await get_patient(db, patient_id)
    return await db.fetch_all(
        f"SELECT {RX} FROM prescriptions WHERE patient_id = ? ORDER BY rx_id", (patient_id,)
    )


async def _rx(db: Db, rx_id: str) -> dict[str, Any]:
    return await db.require_one(
        f"SELECT {RX} FROM prescriptions WHERE rx_id = ?", (rx_id,), f"prescription {rx_id} not found"
    )


@tool(writes=["fills", "prescriptions", "drugs"])
async def fill_prescription(db: Db, rx_id: str, quantity: int) -> dict[str, Any]:
    """Dispense an active prescription with refills left; stock must cover the quantity.

    Args:
        rx_id: The prescription id.
        quantity: Units to dispense (1-90).
    """
    rx = await _rx(db, rx_id)
    if rx["status"] != "active":
        raise ToolError(f"prescription {rx_id} is {rx['status']}")
    if rx["refills_left"] < 1:
        raise ToolError(f"prescription {rx_id} has no refills left")
    if not 1 <= quantity <= 90:
        raise ToolError("quantity must be between 1 and 90")
    drug = await get_drug(db, rx["drug_id"])
    if drug["stock"] < quantity:
        raise ToolError(f"only {drug['stock']} units of {drug['name']} in stock")
    n = (await db.fetch_all("SELECT MAX(CAST(substr(fill_id, 3) AS INTEGER)) AS n FROM fills"))[0]["n"] or 0
    fill_id = f"F-{n + 1}"
    await db.execute(
        "INSERT INTO fills (fill_id, rx_id, quantity, filled_on, total_cents) VALUES (?, ?, ?, ?, ?)",
        (fill_id, rx_id, quantity, TODAY, quantity * drug["price_cents"]),
    )
    await db.execute("UPDATE prescriptions SET refills_left = refills_left - 1 WHERE rx_id = ?", (rx_id,))
    await db.execute("UPDATE drugs SET stock = stock - ? WHERE drug_id = ?", (quantity, drug["drug_id"]))
    return await db.require_one(f"SELECT {FILL} FROM fills WHERE fill_id = ?", (fill_id,), "fill not found")


@tool(writes=["prescriptions"])
async def cancel_prescription(db: Db, rx_id: str) -> dict[str, Any]:
    """Cancel an active prescription.

    Args:
        rx_id: The prescription id.
    """
    rx = await _rx(db, rx_id)
    if rx["status"] != "active":
        raise ToolError(f"prescription {rx_id} is already {rx['status']}")
    await db.execute("UPDATE prescriptions SET status = 'cancelled' WHERE rx_id = ?", (rx_id,))
    return {**rx, "status": "cancelled"}


@tool(writes=["drugs"])
async def restock_drug(db: Db, drug_id: str, quantity: int) -> dict[str, Any]:
    """Add units to a drug's stock.

    Args:
        drug_id: The drug id.
        quantity: Units received (1-1000).
    """
    await get_drug(db, drug_id)
    if not 1 <= quantity <= 1000:
        raise ToolError("quantity must be between 1 and 1000")
    await db.execute("UPDATE drugs SET stock = stock + ? WHERE drug_id = ?", (quantity, drug_id))
    return await get_drug(db, drug_id)
